package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// withLimiter runs a command that works on a limiter: it parses nargs
// positional arguments, runs check on them (if not nil), opens the limiter
// and runs fn, which returns the exit status.
func (f *flags) withLimiter(ctx context.Context, args []string, nargs int, check func(pos []string) error, fn func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error)) int {
	pos, err := f.parse(args, nargs, nargs)
	if err != nil {
		return f.fail(err)
	}
	if check != nil {
		if err := check(pos); err != nil {
			return f.fail(err)
		}
	}
	l, done, err := f.limiter(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer done()
	ctx, cancel := f.withTimeout(ctx)
	defer cancel()
	code, err := fn(ctx, l, pos)
	if err != nil {
		return f.fail(err)
	}
	return code
}

// resultJSON is a check's, a peek's or a refund's result for --json. Allowed
// is only a check's; Cost and Refunded say what was asked.
type resultJSON struct {
	Key          string `json:"key"`
	Allowed      *bool  `json:"allowed,omitempty"`
	Cost         int64  `json:"cost,omitempty"`
	Refunded     int64  `json:"refunded,omitempty"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	Granted      int64  `json:"granted"`
	RequestID    string `json:"request_id,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	ResetAfterMS int64  `json:"reset_after_ms"`
}

func newResultJSON(key string, r pgratelimit.Result) resultJSON {
	return resultJSON{Key: key, Limit: r.Limit, Remaining: r.Remaining, Granted: r.Granted, RetryAfterMS: r.RetryAfter.Milliseconds(), ResetAfterMS: r.ResetAfter.Milliseconds()}
}

// human formats a wait for people: to the millisecond below 10s, else to the
// second, always rounded up (a wait shown is never shorter than the truth).
func human(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	unit := time.Second
	if d < 10*time.Second {
		unit = time.Millisecond
	}
	if r := d % unit; r != 0 {
		d += unit - r
	}
	return d.String()
}

// grantedText mentions a key's grants, if it has any.
func grantedText(r pgratelimit.Result) string {
	if r.Granted == 0 {
		return ""
	}
	return fmt.Sprintf(" and %d granted", r.Granted)
}

// retryText says when a denied check may succeed.
func retryText(r pgratelimit.Result) string {
	if r.RetryAfter == pgratelimit.InfDuration {
		return "refills alone will never cover it (grant more)"
	}
	return "retry in " + human(r.RetryAfter)
}

// fullness says when a bucket is full again.
func fullness(r pgratelimit.Result) string {
	if r.Remaining >= r.Limit {
		return "full"
	}
	return "full in " + human(r.ResetAfter)
}

func plural(n int64, one, many string) string {
	if n == 1 || n == -1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func runAllow(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "allow").withPolicy()
	cost := f.Int64("cost", 1, "tokens to take")
	requestID := f.String("request-id", "", "an idempotency key: a repeat with the same ID prints the first outcome and charges nothing")
	check := func([]string) error {
		switch {
		case *cost < 1:
			return usagef("--cost must be at least 1, got %d", *cost)
		case *cost > f.capacity && f.capacity > 0:
			// (A limiter with Config.Grants allows such a cost when grants
			// cover it; the CLI keeps its checks within the bucket.)
			return usagef("--cost %d is more than the bucket's capacity (--capacity %d): such a check could never be allowed", *cost, f.capacity)
		}
		return nil
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		if *requestID != "" {
			ctx = pgratelimit.WithRequestID(ctx, *requestID)
		}
		r, err := l.AllowN(ctx, key, *cost)
		if err != nil {
			return 0, err
		}
		if f.json {
			j := newResultJSON(key, r)
			j.Allowed, j.Cost, j.RequestID = &r.Allowed, *cost, *requestID
			f.printJSON(j)
		} else if r.Allowed {
			fmt.Fprintf(c.stdout, "allowed: took %s from %q: %d of %d left%s, %s\n",
				plural(*cost, "token", "tokens"), key, r.Remaining, r.Limit, grantedText(r), fullness(r))
		} else {
			fmt.Fprintf(c.stdout, "denied: %q has %d of %d tokens%s, not the %d asked for (nothing taken); %s\n",
				key, r.Remaining, r.Limit, grantedText(r), *cost, retryText(r))
		}
		if !r.Allowed {
			return exitDenied, nil
		}
		return exitOK, nil
	})
}

func runPeek(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "peek").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		switch {
		case f.json:
			f.printJSON(newResultJSON(key, r))
		case r.Remaining >= r.Limit:
			fmt.Fprintf(c.stdout, "%q has %d of %d tokens (full)\n", key, r.Remaining, r.Limit)
		case r.Remaining == 0:
			fmt.Fprintf(c.stdout, "%q has 0 of %d tokens (empty): next token in %s, full in %s\n", key, r.Limit, human(r.RetryAfter), human(r.ResetAfter))
		default:
			fmt.Fprintf(c.stdout, "%q has %d of %d tokens, full in %s\n", key, r.Remaining, r.Limit, human(r.ResetAfter))
		}
		return exitOK, nil // peeking checks nothing, so it is never "denied"
	})
}

func runRefund(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "refund").withPolicy()
	var n int64
	check := func(pos []string) error {
		var err error
		n, err = strconv.ParseInt(pos[1], 10, 64)
		switch {
		case err != nil:
			return usagef("N, the tokens to give back, must be a whole number, got %q", pos[1])
		case n < 1:
			return usagef("N, the tokens to give back, must be at least 1, got %d (allow KEY --cost N takes tokens)", n)
		}
		return nil
	}
	return f.withLimiter(ctx, args, 2, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Refund(ctx, key, n)
		if err != nil {
			return 0, err
		}
		switch {
		case f.json:
			j := newResultJSON(key, r)
			j.Refunded = n
			f.printJSON(j)
		case r.Remaining >= r.Limit:
			fmt.Fprintf(c.stdout, "refunded: %q is full, %d of %d tokens (a refund never fills a bucket past its capacity)\n", key, r.Remaining, r.Limit)
		default:
			fmt.Fprintf(c.stdout, "refunded %s to %q: it has %d of %d tokens, %s\n", plural(n, "token", "tokens"), key, r.Remaining, r.Limit, fullness(r))
		}
		return exitOK, nil
	})
}

func runReset(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "reset").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		if err := l.Reset(ctx, pos[0]); err != nil {
			return 0, err
		}
		if f.json {
			f.printJSON(map[string]any{"key": pos[0], "reset": true})
		} else {
			fmt.Fprintf(c.stdout, "reset: %q is full again (%d tokens)\n", pos[0], f.capacity)
		}
		return exitOK, nil
	})
}

func runGrant(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "grant").withPolicy()
	expires := f.String("expires", "", "when the grant expires: an RFC 3339 time, a date (midnight UTC), or a duration from now such as 720h (default: never)")
	var n int64
	var until time.Time
	check := func(pos []string) error {
		var err error
		n, err = strconv.ParseInt(pos[1], 10, 64)
		switch {
		case err != nil:
			return usagef("N, the credits to grant, must be a whole number, got %q", pos[1])
		case n < 1:
			return usagef("N, the credits to grant, must be at least 1, got %d", n)
		case !f.grants():
			return usagef("grants are kept for durable storage only (--storage durable)")
		}
		until, err = parseExpiry(*expires, time.Now())
		return err
	}
	return f.withLimiter(ctx, args, 2, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		g, err := l.Grant(ctx, key, n, until)
		if err != nil {
			return 0, err
		}
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		if f.json {
			f.printJSON(map[string]any{"key": key, "grant": grantJSONOf(g), "granted": r.Granted, "remaining": r.Remaining, "limit": r.Limit})
			return exitOK, nil
		}
		fmt.Fprintf(c.stdout, "granted %d to %q (grant %d, %s): %d granted in all, %d of %d in the bucket\n",
			n, key, g.ID, expiryText(g.ExpiresAt), r.Granted, r.Remaining, r.Limit)
		return exitOK, nil
	})
}

func runBalance(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "balance").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		var gs []pgratelimit.Grant
		if f.grants() {
			if gs, err = l.Grants(ctx, key); err != nil {
				return 0, err
			}
		}
		if f.json {
			j := struct {
				resultJSON
				Grants []grantJSON `json:"grants"`
			}{newResultJSON(key, r), []grantJSON{}}
			for _, g := range gs {
				j.Grants = append(j.Grants, grantJSONOf(g))
			}
			f.printJSON(j)
			return exitOK, nil
		}
		fmt.Fprintf(c.stdout, "%q: %d of %d tokens in the bucket (%s); %d granted in %s\n",
			key, r.Remaining, r.Limit, fullness(r), r.Granted, plural(int64(len(gs)), "live grant", "live grants"))
		for _, g := range gs {
			fmt.Fprintf(c.stdout, "  grant %d: %d left, %s (granted %s)\n", g.ID, g.Amount, expiryText(g.ExpiresAt), g.GrantedAt.UTC().Format(time.RFC3339))
		}
		return exitOK, nil
	})
}

// grantJSON is a grant for --json.
type grantJSON struct {
	ID        int64      `json:"id"`
	Amount    int64      `json:"amount"`
	ExpiresAt *time.Time `json:"expires_at"` // null: never
	GrantedAt time.Time  `json:"granted_at"`
}

func grantJSONOf(g pgratelimit.Grant) grantJSON {
	j := grantJSON{ID: g.ID, Amount: g.Amount, GrantedAt: g.GrantedAt.UTC()}
	if !g.ExpiresAt.IsZero() {
		t := g.ExpiresAt.UTC()
		j.ExpiresAt = &t
	}
	return j
}

func runSettle(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "settle").withPolicy()
	requestID := f.String("request-id", "", "the request ID of the estimate's check (required)")
	actual := f.Int64("actual", -1, "the actual cost (required; 0 or more)")
	check := func([]string) error {
		switch {
		case *requestID == "":
			return usagef("--request-id is required: the ID the estimate was taken with (allow --request-id)")
		case *actual < 0:
			return usagef("--actual is required: the actual cost, 0 or more")
		}
		return nil
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Settle(ctx, key, *requestID, *actual)
		if err != nil {
			return 0, err
		}
		if f.json {
			j := newResultJSON(key, r)
			j.RequestID = *requestID
			f.printJSON(j)
			return exitOK, nil
		}
		fmt.Fprintf(c.stdout, "settled request %q of %q at %d: %d of %d tokens%s%s\n",
			*requestID, key, *actual, r.Remaining, r.Limit, grantedText(r), debtText(r))
		return exitOK, nil
	})
}

func debtText(r pgratelimit.Result) string {
	if r.Remaining >= 0 {
		return ""
	}
	return fmt.Sprintf(" (a debt of %d: checks are denied until refills or grants repay it)", -r.Remaining)
}

func runLedger(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "ledger").withPolicy()
	since := f.String("since", "", "only entries at or after T: an RFC 3339 time, a date, or a duration before now such as 24h (default: all)")
	var from time.Time
	check := func([]string) error {
		if *since == "" {
			return nil
		}
		if d, err := time.ParseDuration(*since); err == nil && d > 0 {
			from = time.Now().Add(-d)
			return nil
		}
		t, err := parseExpiry(*since, time.Now())
		if err != nil {
			return usagef("--since must be an RFC 3339 time, a date or a duration, got %q", *since)
		}
		from = t
		return nil
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		es, err := l.Ledger(ctx, pos[0], from)
		if err != nil {
			return 0, err
		}
		if f.json {
			type entry struct {
				ID        int64     `json:"id"`
				At        time.Time `json:"at"`
				Amount    int64     `json:"amount"`
				Kind      string    `json:"kind"`
				RequestID string    `json:"request_id,omitempty"`
				Balance   int64     `json:"balance"`
			}
			out := []entry{}
			for _, e := range es {
				out = append(out, entry{e.ID, e.At.UTC(), e.Amount, e.Kind, e.RequestID, e.Balance})
			}
			f.printJSON(out)
			return exitOK, nil
		}
		if len(es) == 0 {
			fmt.Fprintf(c.stdout, "%q has no ledger entries (the ledger records limiters with Config.Ledger and the CLI's durable checks)\n", pos[0])
		}
		for _, e := range es {
			line := fmt.Sprintf("%s  %-6s %+d  balance %d", e.At.UTC().Format(time.RFC3339Nano), e.Kind, e.Amount, e.Balance)
			if e.RequestID != "" {
				line += "  request " + strconv.Quote(e.RequestID)
			}
			fmt.Fprintln(c.stdout, line)
		}
		return exitOK, nil
	})
}

func expiryText(t time.Time) string {
	if t.IsZero() {
		return "never expires"
	}
	return "expires " + t.UTC().Format(time.RFC3339)
}

// parseExpiry reads --expires: an RFC 3339 time, a date (midnight UTC), or
// a duration after now; "" is never.
func parseExpiry(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(d), nil
	}
	return time.Time{}, usagef("--expires must be an RFC 3339 time (2027-01-31T00:00:00Z), a date (2027-01-31) or a positive duration (720h), got %q", s)
}
