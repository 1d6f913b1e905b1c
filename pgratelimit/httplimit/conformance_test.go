package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pgratelimit/pgratelimit/internal/middleware/middlewaretest"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

// TestConformance runs the middleware conformance suite against Middleware.
func TestConformance(t *testing.T) { middlewaretest.Run(t, driver{}) }

// driver serves Middleware on a loopback HTTP server: 200, 429, 400 and 503
// are the suite's OK, Denied, Invalid and Unavailable.
type driver struct{}

func (driver) PeerKey() string { return "ip:127.0.0.1" }

func (driver) Serve(t *testing.T, cfg middlewaretest.Config, handle func(middlewaretest.Request), limiters ...*pgratelimit.Limiter) (middlewaretest.Client, error) {
	c := httplimit.Config{Semaphore: cfg.Semaphore, FailOpen: cfg.FailOpen, Shadow: cfg.Shadow, CheckTimeout: cfg.CheckTimeout, Logger: cfg.Logger}
	if cfg.KeyFunc != nil {
		c.KeyFunc = func(r *http.Request) (string, error) { return cfg.KeyFunc(r.Header) }
	}
	if cfg.Limiters != nil {
		c.Limiters = func(r *http.Request, key string) ([]*pgratelimit.Limiter, error) { return cfg.Limiters(r.Header, key) }
	}
	if cfg.Cost != nil {
		c.Cost = func(r *http.Request) int64 { return cfg.Cost(r.Header) }
	}
	if cfg.Exempt != nil {
		c.Exempt = func(r *http.Request) bool { return cfg.Exempt(r.Header) }
	}
	if cfg.Weight != nil {
		c.Weight = func(r *http.Request) int64 { return cfg.Weight(r.Header) }
	}
	mw, err := httplimit.Middleware(c, limiters...)
	if err != nil {
		return nil, err
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { handle(r.Header) })))
	t.Cleanup(srv.Close)
	return client{srv}, nil
}

type client struct{ srv *httptest.Server }

func (c client) Do(t *testing.T, kv ...string) middlewaretest.Response {
	req, err := http.NewRequestWithContext(t.Context(), "GET", c.srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	res, err := c.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	r := middlewaretest.Response{
		Raw:    res.Status,
		Policy: res.Header.Get("RateLimit-Policy"), RateLimit: res.Header.Get("RateLimit"), RetryAfter: res.Header.Get("Retry-After"),
	}
	switch res.StatusCode {
	case http.StatusOK:
		r.Status = middlewaretest.OK
	case http.StatusTooManyRequests:
		r.Status = middlewaretest.Denied
	case http.StatusBadRequest:
		r.Status = middlewaretest.Invalid
	case http.StatusServiceUnavailable:
		r.Status = middlewaretest.Unavailable
	}
	return r
}
