package httplimit

import (
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"no proxy", "203.0.113.9:5555", nil, "203.0.113.9"},
		{"spoofed header from an untrusted peer is ignored", "203.0.113.9:5555", []string{"1.1.1.1"}, "203.0.113.9"},
		{"trusted peer, one hop", "10.0.0.2:80", []string{"198.51.100.7"}, "198.51.100.7"},
		{"client prepends a spoofed hop: still the rightmost untrusted", "10.0.0.2:80", []string{"1.1.1.1, 198.51.100.7"}, "198.51.100.7"},
		{"trusted hops are skipped", "10.0.0.2:80", []string{"198.51.100.7, 10.1.1.1", "10.2.2.2"}, "198.51.100.7"},
		{"all hops trusted: the leftmost", "10.0.0.2:80", []string{"10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"garbage stops at the last trusted hop", "10.0.0.2:80", []string{"198.51.100.7, nonsense, 10.1.1.1"}, "10.1.1.1"},
		{"trusted peer without header", "10.0.0.2:80", nil, "10.0.0.2"},
		{"IPv6 peer", "[2001:db8::1]:443", nil, "2001:db8::1"},
		{"IPv4-mapped IPv6 is unmapped", "[::ffff:203.0.113.9]:1", nil, "203.0.113.9"},
		{"IPv6 via trusted IPv6 proxy, with port in header", "[fd00::1]:80", []string{"[2001:db8::5]:1234"}, "2001:db8::5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got, err := ClientIP(r, trusted)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestKeyFuncs(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[2001:db8:1:2:3:4:5:6]:443"
	k, err := KeyByIP(IPKeyConfig{IPv6Prefix: 64})(r)
	if err != nil || k != "ip:2001:db8:1:2::/64" {
		t.Fatalf("IPv6 /64: %q %v", k, err)
	}
	k, err = KeyByIP(IPKeyConfig{})(r)
	if err != nil || k != "ip:2001:db8:1:2:3:4:5:6" {
		t.Fatalf("IPv6: %q %v", k, err)
	}
	r.RemoteAddr = "not an address"
	if _, err := KeyByIP(IPKeyConfig{})(r); err == nil {
		t.Fatal("bad remote address gave a key")
	}

	if _, err := KeyByHeader("X-API-Key")(r); err == nil {
		t.Fatal("missing header gave a key")
	}
	r.Header.Set("X-API-Key", "secret")
	k, err = KeyByHeader("X-API-Key")(r)
	// sha256("secret")
	if err != nil || k != "hdr:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b" {
		t.Fatalf("header key %q %v", k, err)
	}
}

func TestHeaderHelpers(t *testing.T) {
	if got := sfString("a\"b\\c\r\nd\xff"); got != `"a\"b\\c??d?"` {
		t.Fatalf("sfString: %s", got)
	}
	for d, want := range map[time.Duration]int64{0: 0, time.Nanosecond: 1, time.Second: 1, 1500 * time.Millisecond: 2} {
		if got := ceilSeconds(d); got != want {
			t.Fatalf("ceilSeconds(%s) = %d", d, got)
		}
	}
	cfg := pgratelimit.Config{Capacity: 10, Refill: 3, Interval: 1500 * time.Millisecond}
	if w := window(cfg, time.Now()); w != 6 { // 4 refills of 1.5s
		t.Fatalf("window %d", w)
	}
	cfg = pgratelimit.Config{Capacity: 1 << 62, Refill: 1, Interval: 100 * 365 * 24 * time.Hour}
	if w := window(cfg, time.Now()); w <= 0 {
		t.Fatalf("huge window overflowed: %d", w)
	}
	// A calendar's window: the seconds left until an empty bucket is full,
	// the rest of the month for a quota that resets, two boundaries for one
	// that needs two refills.
	now := time.Date(2026, 2, 10, 12, 0, 0, 0, time.UTC)
	cfg = pgratelimit.Config{Capacity: 1000, Refill: 1000, Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}}
	if w, want := window(cfg, now), int64(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Sub(now)/time.Second); w != want {
		t.Fatalf("monthly window %d, want %d (to March 1st)", w, want)
	}
	cfg.Capacity = 1500
	if w, want := window(cfg, now), int64(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Sub(now)/time.Second); w != want {
		t.Fatalf("rollover window %d, want %d (to April 1st)", w, want)
	}
}
