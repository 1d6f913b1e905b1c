package middleware

import (
	"crypto/sha256"
	"encoding/hex"
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
