package pgratelimit

import (
	"fmt"
	"testing"
	"time"
)

func TestDenyCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newDenyCache(3)
	denied := Result{Limit: 10, Remaining: 2, RetryAfter: 10 * time.Second, ResetAfter: time.Minute}
	c.store("k", 5, denied, now)

	r, ok := c.lookup("k", 5, now.Add(4*time.Second))
	if !ok || r.Allowed || r.RetryAfter != 6*time.Second || r.ResetAfter != 56*time.Second || r.Remaining != 2 {
		t.Fatalf("same cost 4s later: %+v %v, want denied, retry in 6s", r, ok)
	}
	if _, ok := c.lookup("k", 7, now); !ok {
		t.Fatal("a bigger cost is denied too")
	}
	if _, ok := c.lookup("k", 4, now); ok {
		t.Fatal("a smaller cost may be allowed: ask the database")
	}
	if _, ok := c.lookup("k", 5, now.Add(10*time.Second)); ok {
		t.Fatal("denied past RetryAfter")
	}
	c.forget("k")
	if _, ok := c.lookup("k", 5, now); ok {
		t.Fatal("forgotten key still denied")
	}

	// Never more than its size; expired entries go first.
	c.store("old", 1, Result{RetryAfter: time.Second}, now.Add(-time.Hour))
	for i := range 10 {
		c.store(fmt.Sprint(i), 1, denied, now)
		if len(c.m) > 3 {
			t.Fatalf("%d entries in a cache of 3", len(c.m))
		}
	}
	if _, ok := c.m["old"]; ok {
		t.Fatal("the expired entry was kept")
	}
	// Nothing to remember: allowed, or refills alone never allow it.
	c.store("inf", 1, Result{RetryAfter: InfDuration}, now)
	c.store("zero", 1, Result{}, now)
	if _, ok := c.m["inf"]; ok {
		t.Fatal("stored an InfDuration denial")
	}
	if _, ok := c.m["zero"]; ok {
		t.Fatal("stored a result without RetryAfter")
	}
}
