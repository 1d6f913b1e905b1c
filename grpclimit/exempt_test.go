package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// watch opens a Watch stream, reads its first message and returns the
// stream's header metadata.
func watch(t *testing.T, c healthpb.HealthClient) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, err
	}
	if _, err := s.Recv(); err != nil {
		return nil, err
	}
	return s.Header()
}

// Exempt streams go on unchecked, without rate-limit metadata, and spend
// nothing: the bucket is whole for the first checked call, and the exempt
// stream still opens once the others are denied.
func TestExemptStream(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "ex", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed})
	c := serve(t, withBoth(t, l, grpclimit.Config{Exempt: grpclimit.ExemptMethods(healthpb.Health_Watch_FullMethodName)})...)
	for i := range 3 {
		h, err := watch(t, c)
		if err != nil {
			t.Fatalf("exempt stream %d: %v", i, err)
		}
		requireFields(t, h, nil)
	}
	h, err := check(c)
	if err != nil {
		t.Fatalf("first checked call: %v", err)
	}
	requireFields(t, h, map[string]string{"ratelimit-policy": `"ex";q=1;w=10`, "ratelimit": `"ex";r=0;t=10`})
	if _, err := check(c); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second checked call: %v", err)
	}
	h, err = watch(t, c)
	if err != nil {
		t.Fatalf("exempt stream while denied: %v", err)
	}
	requireFields(t, h, nil)
}
