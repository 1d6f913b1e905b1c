package connectlimit_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/pgratelimit/pgratelimit/connectlimit"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Exempt streams go on unchecked, without rate-limit headers, and spend
// nothing: the bucket is whole for the first checked call, and the exempt
// stream still runs once the others are denied; over Connect and gRPC.
func TestExemptStream(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		pool := testdb.Pool(t)
		for _, protocol := range []string{"connect", "grpc"} {
			l := newLimiter(t, pool, pgratelimit.Config{Prefix: protocol, Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed, DisableCoalescing: off})
			c := serve(t, protocol, interceptor(t, connectlimit.Config{Exempt: connectlimit.ExemptProcedures(count)}, l))
			for i := range 3 {
				h, err := c.stream()
				if err != nil {
					t.Fatalf("%s: exempt stream %d: %v", protocol, i, err)
				}
				requireFields(t, h, nil)
			}
			h, err := c.call()
			if err != nil {
				t.Fatalf("%s: first checked call: %v", protocol, err)
			}
			requireFields(t, h, map[string]string{"RateLimit-Policy": `"` + protocol + `";q=1;w=10`, "RateLimit": `"` + protocol + `";r=0;t=10`})
			if _, err := c.call(); connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Fatalf("%s: second checked call: %v", protocol, err)
			}
			h, err = c.stream()
			if err != nil {
				t.Fatalf("%s: exempt stream while denied: %v", protocol, err)
			}
			requireFields(t, h, nil)
		}
	})
}
