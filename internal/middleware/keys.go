package middleware

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"slices"
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

// IPKeyConfig configures the keys of clients by IP address. Each adapter
// has a type of its own with the same fields (httplimit.IPKeyConfig,
// grpclimit.IPKeyConfig, connectlimit.IPKeyConfig), converted to this one,
// so that a client has one key whichever way it comes in.
type IPKeyConfig struct {
	// TrustedProxies are the networks of the service's own proxies and
	// load balancers: X-Forwarded-For is believed only when the direct peer
	// is in one of them.
	TrustedProxies []netip.Prefix

	// IPv6Prefix, when in 1..127, keys IPv6 clients by their network of
	// this many bits instead of by address.
	IPv6Prefix int
}

// Key returns the key of a client whose direct peer is peer ("ip",
// "ip:port" or "[ipv6]:port") and whose X-Forwarded-For fields, in the
// order received, are forwardedFor: "ip:ADDRESS", or "ip:NETWORK/BITS"
// with IPv6Prefix. An unparsable peer is an error.
func (c IPKeyConfig) Key(peer string, forwardedFor []string) (string, error) {
	ip, err := ClientAddr(peer, forwardedFor, c.TrustedProxies)
	if err != nil {
		return "", err
	}
	if ip.Is6() && c.IPv6Prefix > 0 && c.IPv6Prefix < 128 {
		p, err := ip.Prefix(c.IPv6Prefix)
		if err != nil {
			return "", err
		}
		return "ip:" + p.String(), nil
	}
	return "ip:" + ip.String(), nil
}

// ClientAddr returns the address of the client whose direct peer is peer
// and whose X-Forwarded-For fields are forwardedFor: the peer, or, when the
// peer is in trusted, the rightmost address of X-Forwarded-For that is not
// in trusted (a client cannot spoof its way past this: only what the
// trusted proxies appended is read). An entry that does not parse stops the
// walk at the last trusted hop, which is then taken as the client. An
// unparsable peer is an error.
func ClientAddr(peer string, forwardedFor []string, trusted []netip.Prefix) (netip.Addr, error) {
	client, err := parseAddr(peer)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("peer address %q is not an IP address", peer)
	}
	isTrusted := func(a netip.Addr) bool {
		return slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	if !isTrusted(client) {
		return client, nil
	}
	var hops []string
	for _, v := range forwardedFor {
		hops = append(hops, strings.Split(v, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := parseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return client, nil
		}
		client = a
		if !isTrusted(a) {
			return client, nil
		}
	}
	return client, nil
}

// parseAddr parses "ip", "ip:port" or "[ipv6]:port", unmapping IPv4-in-IPv6.
func parseAddr(s string) (netip.Addr, error) {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return a.Unmap().WithZone(""), nil
}
