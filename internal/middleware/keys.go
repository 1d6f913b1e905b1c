package middleware

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// SecretKey is the key of a request keyed by a secret, such as an API key
// in a header or in metadata: "hdr:" and the value's SHA-256 in hex, so that
// the secret itself is never written to the database, and a client has one
// bucket whichever way it comes in.
func SecretKey(value string) string {
	sum := sha256.Sum256([]byte(value))
	return "hdr:" + hex.EncodeToString(sum[:])
}

// MethodKey is the key of a call keyed by its method alone:
// "method:/package.Service/Method", for grpc-go and Connect alike.
func MethodKey(fullMethod string) string { return "method:" + fullMethod }

// MatchMethods returns a func that reports whether a full method name
// ("/package.Service/Method", as grpc-go and Connect give it) is one of
// names. A name is a method ("/package.Service/Method", the leading slash
// optional) or a service ("package.Service"), which names each of its
// methods.
func MatchMethods(names ...string) func(fullMethod string) bool {
	methods := make(map[string]bool)
	services := make(map[string]bool)
	for _, n := range names {
		n = strings.Trim(n, "/")
		if strings.Contains(n, "/") {
			methods["/"+n] = true
		} else if n != "" {
			services[n] = true
		}
	}
	return func(fullMethod string) bool {
		if methods[fullMethod] {
			return true
		}
		service, _, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
		return ok && services[service]
	}
}
