package integration

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

var megabyte = strings.Repeat("k", 1<<20)

// Every hostile input through the API and the middleware gets a typed error
// or a correct result, and the table holds exactly what it should after.
func TestHostileInputTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	const capacity = 5
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "h", Capacity: capacity, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)

	type want int
	const (
		ok want = iota
		badKey
		badCost
		tooCostly
	)
	cases := []struct {
		name string
		key  string
		cost int64
		want want
	}{
		{"empty key", "", 1, badKey},
		{"1 MB key", megabyte, 1, badKey},
		{"NUL key", "a\x00b", 1, badKey},
		{"invalid UTF-8 key", "\xff\xfe", 1, badKey},
		{"cost 0", "c0", 0, badCost},
		{"cost -1", "c-1", -1, badCost},
		{"cost MinInt64", "cmin", math.MinInt64, badCost},
		{"cost MaxInt64", "cmax", math.MaxInt64, tooCostly},
		{"cost > capacity", "cbig", capacity + 1, tooCostly},
		{"SQL", "'); DROP TABLE pgratelimit_buckets; --", 2, ok},
		{"JSON", `{"a":[1,"\u0000"]}`, 2, ok},
		{"CR LF", "x\r\nSet-Cookie: pwned=1", 2, ok},
		{"percent and dollars", "%s%d$1$$", 2, ok},
		{"longest key", strings.Repeat("é", 512), 2, ok},
	}
	expected := map[string]int64{} // key -> tokens left
	for _, tc := range cases {
		r, err := l.AllowN(ctx, tc.key, tc.cost)
		switch tc.want {
		case badKey:
			require.ErrorIs(t, err, pgratelimit.ErrInvalidKey, tc.name)
		case badCost:
			require.ErrorIs(t, err, pgratelimit.ErrInvalidCost, tc.name)
		case tooCostly:
			require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity, tc.name)
		case ok:
			require.NoError(t, err, tc.name)
			require.True(t, r.Allowed, tc.name)
			expected[tc.key] = capacity - tc.cost
		}
	}

	// The same through the middleware, keyed by a raw header so the
	// hostile value reaches the limiter.
	h := mw(t, httplimit.Config{
		KeyFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil },
	}, l)(okHandler)
	for _, tc := range cases {
		if tc.cost != 2 && tc.want == ok {
			continue
		}
		req := httptest.NewRequest("GET", "/", nil)
		req.Header["X-Key"] = []string{tc.key}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if tc.want == badKey {
			require.Equal(t, http.StatusBadRequest, w.Code, tc.name)
			continue
		}
		require.Equal(t, http.StatusOK, w.Code, tc.name) // cost 1 of what is left
		require.Empty(t, w.Header().Get("Set-Cookie"), "no header injection")
		for k := range w.Header() {
			require.NotContains(t, k, "\n")
		}
		if tc.want == ok {
			expected[tc.key]--
		} else {
			expected[tc.key] = capacity - 1 // keys of refused costs, seen for the first time
		}
	}

	rows, err := pool.Query(ctx, `SELECT key, tokens FROM pgratelimit_buckets WHERE prefix = 'h'`)
	require.NoError(t, err)
	got := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		require.NoError(t, rows.Scan(&k, &n))
		got[k] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, expected, got)
}

// Extreme but valid configs give correct, saturated results.
func TestExtremeConfigs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	century := 100 * 365 * 24 * time.Hour
	clock := newClock()

	huge, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "huge", Capacity: math.MaxInt64, Refill: math.MaxInt64, Interval: century, Clock: clock.Now})
	require.NoError(t, err)
	r, err := huge.AllowN(ctx, "k", math.MaxInt64)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(0), r.Remaining)
	// Refills fall at whole centuries since the Unix epoch: the next in 2069.
	next := time.Unix(0, 0).Add(century).Sub(clock.Now())
	require.Equal(t, next, r.ResetAfter, "one refill, at the next century of the grid")
	r, err = huge.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, next, r.RetryAfter)

	slow, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "slow", Capacity: math.MaxInt64, Refill: 1, Interval: century, Clock: clock.Now})
	require.NoError(t, err)
	r, err = slow.AllowN(ctx, "k", math.MaxInt64/2)
	require.NoError(t, err)
	require.Equal(t, int64(math.MaxInt64-math.MaxInt64/2), r.Remaining)
	require.Equal(t, time.Duration(math.MaxInt64), r.ResetAfter, "2^62 centuries: saturated")
	r, err = slow.AllowN(ctx, "k", math.MaxInt64)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, time.Duration(math.MaxInt64), r.RetryAfter, "saturated, not overflowed")

	fast, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "fast", Capacity: 3, Refill: math.MaxInt64, Interval: time.Microsecond, Clock: clock.Now})
	require.NoError(t, err)
	for range 10 {
		clock.Add(time.Microsecond) // a whole refill, capped
		r, err := fast.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, int64(0), r.Remaining)
	}

	h := mw(t, httplimit.Config{LegacyHeaders: true}, huge)(okHandler)
	w := serve(h, "192.0.2.9:1", nil)
	require.Equal(t, http.StatusOK, w.Code)
	// RFC 8941 integers have at most 15 digits: larger ones are clamped,
	// and a strict structured-field parser accepts both fields.
	require.Equal(t, `"huge";q=999999999999999;w=3153600000`, w.Header().Get("RateLimit-Policy"))
	for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
		list, err := httpsfv.UnmarshalList(w.Header().Values(field))
		require.NoError(t, err, "%s: %s", field, w.Header().Get(field))
		require.Len(t, list, 1)
	}
}
