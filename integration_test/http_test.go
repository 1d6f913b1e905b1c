package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

func serve(h http.Handler, peer string, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/thing", nil)
	r.RemoteAddr = peer
	for k, vs := range header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareHeaders(t *testing.T) {
	t.Parallel()
	clock := newClock()
	clock.Set(500 * time.Millisecond) // half a second past a boundary of the grid (whole 10s since the epoch)
	l := newLimiter(t, pgratelimit.Config{Prefix: "api", Capacity: 3, Refill: 1, Interval: 10 * time.Second, Clock: clock.Now})
	h := mw(t, httplimit.Config{LegacyHeaders: true}, l)(okHandler)

	for i, want := range []string{`"api";r=2;t=10`, `"api";r=1;t=20`, `"api";r=0;t=30`} {
		w := serve(h, "198.51.100.1:1000", nil)
		require.Equal(t, http.StatusOK, w.Code, "request %d", i)
		require.Equal(t, "ok", w.Body.String())
		require.Equal(t, `"api";q=3;w=30`, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, want, w.Header().Get("RateLimit"))
		require.Equal(t, "3", w.Header().Get("X-RateLimit-Limit"))
		require.Equal(t, strconv.Itoa(2-i), w.Header().Get("X-RateLimit-Remaining"))
		require.Empty(t, w.Header().Get("Retry-After"))
	}

	// Refills fall at whole 10s: at 10.5s a token is back; take it, then
	// the next is at 20s. At 12.3s the wait is 7.7s and Retry-After says
	// 8; at 19.9s the real wait is 0.1s and it says 1, never 0: rounded
	// up, a client that obeys is never early.
	clock.Set(10*time.Second + 500*time.Millisecond)
	require.Equal(t, http.StatusOK, serve(h, "198.51.100.1:1000", nil).Code)
	clock.Set(12*time.Second + 300*time.Millisecond)
	w := serve(h, "198.51.100.1:1000", nil)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "8", w.Header().Get("Retry-After"))
	require.Equal(t, `"api";r=0;t=28`, w.Header().Get("RateLimit"), "full at 40s: 27.7s rounded up")
	require.Contains(t, w.Body.String(), "too many requests")
	clock.Set(19*time.Second + 900*time.Millisecond)
	w = serve(h, "198.51.100.1:1000", nil)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "1", w.Header().Get("Retry-After"))

	// Another client has its own bucket.
	require.Equal(t, http.StatusOK, serve(h, "198.51.100.2:1000", nil).Code)
}

func TestMiddlewareForwardedFor(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, pgratelimit.Config{Prefix: "xff", Capacity: 1, Refill: 1, Interval: time.Hour})
	h := mw(t, httplimit.Config{KeyFunc: httplimit.KeyByIP(httplimit.IPKeyConfig{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})}, l)(okHandler)

	// An untrusted client cannot escape its bucket by inventing hops.
	require.Equal(t, http.StatusOK, serve(h, "203.0.113.5:1", nil).Code)
	for _, spoof := range []string{"1.1.1.1", "2.2.2.2", "10.0.0.1"} {
		w := serve(h, "203.0.113.5:1", http.Header{"X-Forwarded-For": {spoof}})
		require.Equal(t, http.StatusTooManyRequests, w.Code, "spoofed %s", spoof)
	}
	// Behind the trusted proxy, clients are told apart by the header.
	for _, client := range []string{"198.51.100.10", "198.51.100.11"} {
		w := serve(h, "10.0.0.2:1", http.Header{"X-Forwarded-For": {"6.6.6.6, " + client}})
		require.Equal(t, http.StatusOK, w.Code, "client %s", client)
		w = serve(h, "10.0.0.2:1", http.Header{"X-Forwarded-For": {"7.7.7.7, " + client}})
		require.Equal(t, http.StatusTooManyRequests, w.Code, "client %s again, other spoofed prefix", client)
	}
	// The proxy's own bucket was never touched.
	r, err := l.Peek(context.Background(), "ip:10.0.0.2")
	require.NoError(t, err)
	require.Equal(t, int64(1), r.Remaining)
}

func TestMiddlewareCostAndKeys(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	clock := newClock() // on the hour: the grid's refills fall on whole hours
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "upload", Capacity: 10, Refill: 1, Interval: time.Hour, Clock: clock.Now})
	require.NoError(t, err)
	h := mw(t, httplimit.Config{
		KeyFunc: httplimit.KeyByHeader("X-API-Key"),
		Cost: func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
			return n
		},
	}, l)(okHandler)

	w := serve(h, "192.0.2.1:1", http.Header{"X-API-Key": {"s3cret"}, "X-Cost": {"4"}})
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"upload";r=6;t=14400`, w.Header().Get("RateLimit"))
	w = serve(h, "192.0.2.1:1", http.Header{"X-API-Key": {"s3cret"}, "X-Cost": {"7"}})
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "3600", w.Header().Get("Retry-After"))

	for name, hdr := range map[string]http.Header{
		"no key":           {"X-Cost": {"1"}},
		"cost 0":           {"X-API-Key": {"k"}, "X-Cost": {"0"}},
		"cost > capacity":  {"X-API-Key": {"k"}, "X-Cost": {"11"}},
		"cost unparseable": {"X-API-Key": {"k"}, "X-Cost": {"lots"}},
	} {
		w := serve(h, "192.0.2.1:1", hdr)
		require.Equal(t, http.StatusBadRequest, w.Code, name)
	}
	// The secret is not stored; its hash is.
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgratelimit_buckets WHERE key LIKE 'hdr:%' AND key NOT LIKE '%s3cret%'`).Scan(&n))
	require.Equal(t, 1, n)
}

// With the database stopped, the middleware fails closed (503) or open.
func TestMiddlewareDatabaseDown(t *testing.T) {
	t.Parallel()
	testdb.Instance(t) // skip or fail like the other tests when there is no PostgreSQL at all
	ctx := context.Background()
	in, err := pglaunch.Start(ctx, pglaunch.Options{})
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, in.URL+"&connect_timeout=2")
	require.NoError(t, err)
	defer pool.Close()
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "down", Capacity: 5, Refill: 1, Interval: time.Second})
	require.NoError(t, err)
	require.NoError(t, in.Close(ctx)) // the database is gone

	closed := mw(t, httplimit.Config{}, l)(okHandler)
	w := serve(closed, "192.0.2.1:1", nil)
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Empty(t, w.Header().Get("RateLimit"))

	open := mw(t, httplimit.Config{FailOpen: true}, l)(okHandler)
	w = serve(open, "192.0.2.1:1", nil)
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "ok", w.Body.String())
}

// Several policies per request: both are charged or neither, RateLimit-Policy
// lists both, RateLimit reports the one closest to denying, and the limiters
// can be picked per request (plans).
func TestMiddlewareAll(t *testing.T) {
	t.Parallel()
	clock := newClock()
	pool := newPool(t)
	limit := func(prefix string, n int64, per time.Duration) *pgratelimit.Limiter {
		l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: prefix, Capacity: n, Refill: n, Interval: per, Clock: clock.Now})
		require.NoError(t, err)
		return l
	}
	plans := map[string][]*pgratelimit.Limiter{
		"free": {limit("second", 3, time.Second), limit("minute", 5, time.Minute)},
		"pro":  {limit("second", 3, time.Second), limit("minute-pro", 100, time.Minute)},
	}
	h := mw(t, httplimit.Config{
		KeyFunc: httplimit.KeyByHeader("X-API-Key"),
		Limiters: func(r *http.Request, key string) ([]*pgratelimit.Limiter, error) {
			if r.Header.Get("X-Plan") == "pro" {
				return plans["pro"], nil
			}
			return plans["free"], nil
		},
	}, plans["free"]...)(okHandler)
	free := http.Header{"X-Api-Key": {"k1"}}

	for i, want := range []string{`"second";r=2;t=1`, `"second";r=1;t=1`, `"second";r=0;t=1`} {
		w := serve(h, "192.0.2.1:1", free)
		require.Equal(t, http.StatusOK, w.Code, "request %d", i)
		require.Equal(t, `"second";q=3;w=1, "minute";q=5;w=60`, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, want, w.Header().Get("RateLimit"), "the per-second limit is the closest to denying")
		for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
			_, err := httpsfv.UnmarshalList(w.Header().Values(field))
			require.NoError(t, err, field)
		}
	}
	w := serve(h, "192.0.2.1:1", free)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "1", w.Header().Get("Retry-After"))

	clock.Add(time.Second)
	for range 2 {
		require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1", free).Code)
	}
	w = serve(h, "192.0.2.1:1", free)
	require.Equal(t, http.StatusTooManyRequests, w.Code, "5 per minute used up")
	require.Equal(t, `"minute";r=0;t=59`, w.Header().Get("RateLimit"), "full a minute after its first check")
	require.Equal(t, "59", w.Header().Get("Retry-After"))
	sec, err := plans["free"][0].Peek(context.Background(), httplimitKey(t, "k1"))
	require.NoError(t, err)
	require.Equal(t, int64(1), sec.Remaining, "the denied request spent nothing per second")

	// The same key on the pro plan: the per-second bucket is shared, the
	// bigger minute limit lets it through.
	w = serve(h, "192.0.2.1:1", http.Header{"X-Api-Key": {"k1"}, "X-Plan": {"pro"}})
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"second";q=3;w=1, "minute-pro";q=100;w=60`, w.Header().Get("RateLimit-Policy"))
}

// httplimitKey is the bucket key KeyByHeader stores for value.
func httplimitKey(t *testing.T, value string) string {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-API-Key", value)
	k, err := httplimit.KeyByHeader("X-API-Key")(r)
	require.NoError(t, err)
	return k
}

// mw is httplimit.Middleware(cfg, limiters...), failing the test on an
// error.
func mw(t *testing.T, cfg httplimit.Config, limiters ...*pgratelimit.Limiter) func(http.Handler) http.Handler {
	t.Helper()
	m, err := httplimit.Middleware(cfg, limiters...)
	require.NoError(t, err)
	return m
}
