package connectlimit_test

import (
	"context"
	"log/slog"
	"sync/atomic"
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
			c := serve(t, protocol, connectlimit.NewInterceptor(l, connectlimit.WithExempt(connectlimit.ExemptProcedures(count))))
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

// An exempt call never reaches the limiter, nor the key and cost functions:
// it goes on with a database that fails closed, and in shadow mode without a
// log; a whole service is exempted by its name, and WithExempt takes any
// func of the call.
func TestExemptTouchesNothing(t *testing.T) {
	t.Parallel()
	broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour})
	var asked atomic.Int64
	logs := &records{}
	in := func(more ...connectlimit.Option) client {
		opts := append([]connectlimit.Option{
			connectlimit.WithKeyFunc(func(context.Context, connectlimit.Call) (string, error) { asked.Add(1); return "k", nil }),
			connectlimit.WithCost(func(context.Context, connectlimit.Call) int64 { asked.Add(1); return 1 }),
			connectlimit.WithLogger(slog.New(logs)),
		}, more...)
		return serve(t, "connect", connectlimit.NewInterceptor(broken, opts...))
	}

	c := in(connectlimit.WithExempt(connectlimit.ExemptProcedures(echo)))
	h, err := c.call()
	if err != nil {
		t.Fatalf("exempt call with a failing database: %v", err)
	}
	requireFields(t, h, nil)
	if n := asked.Load(); n != 0 {
		t.Fatalf("key or cost asked %d times for an exempt call", n)
	}
	if _, err := c.stream(); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a stream not exempt: %v, want it checked (unavailable)", err)
	}

	internal := connectlimit.WithExempt(func(_ context.Context, call connectlimit.Call) bool {
		return call.Header.Get("X-Internal") == "yes"
	})
	for name, c := range map[string]client{
		"service": in(connectlimit.WithExempt(connectlimit.ExemptProcedures("test.v1.Test"))),
		"shadow":  in(connectlimit.WithExempt(connectlimit.ExemptProcedures("/test.v1.Test/")), connectlimit.WithShadow()),
	} {
		if h, err := c.call(); err != nil || h.Get("RateLimit") != "" {
			t.Fatalf("%s: exempt call: %v %v", name, err, h)
		}
		h, err := c.stream()
		if err != nil {
			t.Fatalf("%s: exempt stream: %v", name, err)
		}
		requireFields(t, h, nil)
	}
	if h, err := in(internal).call("X-Internal", "yes"); err != nil || h.Get("RateLimit") != "" {
		t.Fatalf("exempt by header: %v %v", err, h)
	}
	if n := asked.Load(); n != 2 {
		t.Fatalf("key and cost asked %d times, want once each (for the stream not exempt)", n)
	}
	if got := logs.get(); len(got) != 1 {
		t.Fatalf("logs %q, want only the failure of the stream not exempt", got)
	}
	if _, err := in(internal).call(); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a call without the header: %v, want it checked (unavailable)", err)
	}
}
