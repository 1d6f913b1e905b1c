package connectlimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pgratelimit/pgratelimit/connectlimit"
	"github.com/pgratelimit/pgratelimit/internal/middleware/middlewaretest"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// TestConformance runs the middleware conformance suite against
// NewInterceptor, over the Connect protocol.
func TestConformance(t *testing.T) { middlewaretest.Run(t, driver{}) }

// driver serves a unary handler with the interceptor on a loopback
// HTTP/2 server: no error, CodeResourceExhausted, CodeInvalidArgument and
// CodeUnavailable are the suite's OK, Denied, Invalid and Unavailable.
type driver struct{}

func (driver) PeerKey() string { return "ip:127.0.0.1" }

func (driver) Serve(t *testing.T, cfg middlewaretest.Config, handle func(middlewaretest.Request), limiters ...*pgratelimit.Limiter) (middlewaretest.Client, error) {
	c := connectlimit.Config{Semaphore: cfg.Semaphore, FailOpen: cfg.FailOpen, Shadow: cfg.Shadow, CheckTimeout: cfg.CheckTimeout, Logger: cfg.Logger}
	if cfg.KeyFunc != nil {
		c.KeyFunc = func(_ context.Context, call connectlimit.Call) (string, error) { return cfg.KeyFunc(call.Header) }
	}
	if cfg.Limiters != nil {
		c.Limiters = func(_ context.Context, call connectlimit.Call, key string) ([]*pgratelimit.Limiter, error) {
			return cfg.Limiters(call.Header, key)
		}
	}
	if cfg.Cost != nil {
		c.Cost = func(_ context.Context, call connectlimit.Call) int64 { return cfg.Cost(call.Header) }
	}
	if cfg.Exempt != nil {
		c.Exempt = func(_ context.Context, call connectlimit.Call) bool { return cfg.Exempt(call.Header) }
	}
	if cfg.Weight != nil {
		c.Weight = func(_ context.Context, call connectlimit.Call) int64 { return cfg.Weight(call.Header) }
	}
	in, err := connectlimit.NewInterceptor(c, limiters...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(echo, connect.NewUnaryHandler(echo, func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		handle(req.Header())
		return connect.NewResponse(req.Msg), nil
	}, connect.WithInterceptors(in)))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return conformanceClient{connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+echo)}, nil
}

type conformanceClient struct {
	echo *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]
}

func (c conformanceClient) Do(t *testing.T, kv ...string) middlewaretest.Response {
	req := connect.NewRequest(wrapperspb.String("hi"))
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header().Set(kv[i], kv[i+1])
	}
	res, err := c.echo.CallUnary(t.Context(), req)
	var h http.Header
	var ce *connect.Error
	switch {
	case err == nil:
		h = res.Header()
	case errors.As(err, &ce):
		h = ce.Meta()
	default:
		t.Fatal(err)
	}
	r := middlewaretest.Response{Raw: connect.CodeOf(err).String(), Policy: h.Get("RateLimit-Policy"), RateLimit: h.Get("RateLimit"), RetryAfter: h.Get("Retry-After")}
	switch {
	case err == nil:
		r.Status, r.Raw = middlewaretest.OK, "ok"
	case ce.Code() == connect.CodeResourceExhausted:
		r.Status = middlewaretest.Denied
	case ce.Code() == connect.CodeInvalidArgument:
		r.Status = middlewaretest.Invalid
	case ce.Code() == connect.CodeUnavailable:
		r.Status = middlewaretest.Unavailable
	}
	if ce != nil {
		for _, d := range ce.Details() {
			if v, err := d.Value(); err == nil {
				if ri, ok := v.(*errdetails.RetryInfo); ok {
					r.RetryDelay, r.HasRetryInfo = ri.GetRetryDelay().AsDuration(), true
				}
			}
		}
	}
	return r
}
