package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
)

// withLimiter runs a command that works on a limiter (runOn), check
// reading its positional arguments first. When the database could not be
// reached (flags.unreachable), fn runs in an ended context, so that the
// library reports bad input (found before any database access) as it does
// with a database, and any other outcome is the unreachable database's
// error.
func (f *flags) withLimiter(ctx context.Context, args []string, nargs int, check func(pos []string) error, fn func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error)) int {
	open := func(ctx context.Context, pos []string) (*pgratelimit.Limiter, func(), error) {
		if check != nil {
			if err := check(pos); err != nil {
				return nil, nil, err
			}
		}
		return f.limiter(ctx)
	}
	return runOn(f, ctx, args, nargs, open, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		if f.unreachable == nil {
			return fn(ctx, l, pos)
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if code, err := fn(ended, l, pos); errors.Is(err, pgratelimit.ErrInvalidArgument) {
			return code, err
		}
		return 0, f.unreachable
	})
}

// runOn runs a command that works on a limiter or a semaphore: it parses
// nargs positional arguments, opens what the command works on with them
// (checking them first), and runs fn on it within --timeout; fn returns the
// exit status.
func runOn[T any](f *flags, ctx context.Context, args []string, nargs int,
	open func(ctx context.Context, pos []string) (T, func(), error), fn func(ctx context.Context, t T, pos []string) (int, error)) int {
	pos, err := f.parse(args, nargs, nargs)
	if err != nil {
		return f.fail(err)
	}
	t, done, err := open(ctx, pos)
	if err != nil {
		return f.fail(err)
	}
	defer done()
	ctx, cancel := f.withTimeout(ctx)
	defer cancel()
	code, err := fn(ctx, t, pos)
	if err != nil {
		return f.fail(err)
	}
	return code
}

// resultJSON is a check's, a peek's, a refund's or a settlement's result
// for --json: Result's fields. Allowed is only a check's; Cost and Refunded
// say what was asked; Replayed says the request ID had been seen: the
// result is the first one's, and nothing was charged now (Result.Replayed);
// FromGrants is the part of the cost the grants paid (Result.FromGrants: 0
// when denied); RetryAfterMS is null when refills alone never allow the
// check (Result.RetryAfter == InfDuration).
type resultJSON struct {
	Key          string `json:"key"`
	Allowed      *bool  `json:"allowed,omitempty"`
	Cost         int64  `json:"cost,omitempty"`
	Refunded     int64  `json:"refunded,omitempty"`
	Actual       *int64 `json:"actual,omitempty"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	Granted      int64  `json:"granted"`
	FromGrants   int64  `json:"from_grants"`
	RequestID    string `json:"request_id,omitempty"`
	Replayed     bool   `json:"replayed"`
	RetryAfterMS *int64 `json:"retry_after_ms"`
	ResetAfterMS int64  `json:"reset_after_ms"`
}

func newResultJSON(key string, r pgratelimit.Result) resultJSON {
	return resultJSON{Key: key, Limit: r.Limit, Remaining: r.Remaining, Granted: r.Granted, FromGrants: r.FromGrants, Replayed: r.Replayed,
		RetryAfterMS: msOrNever(r.RetryAfter), ResetAfterMS: r.ResetAfter.Milliseconds()}
}

// msOrNever is a wait in milliseconds for --json, or nil (null) for
// pgratelimit.InfDuration: never.
func msOrNever(d time.Duration) *int64 {
	if d == pgratelimit.InfDuration {
		return nil
	}
	ms := d.Milliseconds()
	return &ms
}

// holding says what a key holds: "3 of 10 tokens", with its debt while it
// owes and its grants if it has any.
func holding(r pgratelimit.Result) string {
	s := fmt.Sprintf("%d of %d tokens", r.Remaining, r.Limit)
	if r.Remaining < 0 {
		s += fmt.Sprintf(" (a debt of %d)", -r.Remaining)
	}
	return s + grantedText(r)
}

// grantedText mentions a key's grants, if it has any.
func grantedText(r pgratelimit.Result) string {
	if r.Granted == 0 {
		return ""
	}
	return fmt.Sprintf(" and %d granted", r.Granted)
}

// retryText says when a denied check may succeed, counted from now.
func retryText(r pgratelimit.Result, now time.Time) string {
	if r.RetryAfter == pgratelimit.InfDuration {
		return "refills alone will never cover it (grant more)"
	}
	return "retry " + human.In(r.RetryAfter, now)
}

// fullness says when a bucket is full again, counted from now.
func fullness(r pgratelimit.Result, now time.Time) string {
	if r.Remaining >= r.Limit {
		return "full"
	}
	return "full " + human.In(r.ResetAfter, now)
}

// mismatchText says what request ID id on key names, for the error of a
// call that named something else (ErrRequestMismatch): "a charge of 40".
// It reads the request only then, after the error, to say what it holds
// ("another operation" if it cannot).
func (f *flags) mismatchText(ctx context.Context, l *pgratelimit.Limiter, key, id string) (admin.Request, string) {
	rec, err := admin.LookupRequest(ctx, f.db, l.Config().Prefix, key, id)
	if err != nil {
		return rec, "another operation or amount"
	}
	return rec, fmt.Sprintf("a %s of %d", rec.Kind, rec.Amount)
}

// tookText says where an allowed check's cost came from: nothing when the
// grants paid none, else what they paid.
func tookText(cost, fromGrants int64) string {
	switch {
	case fromGrants <= 0:
		return ""
	case fromGrants >= cost:
		return " (all from grants)"
	}
	return fmt.Sprintf(" (%d from the bucket, %d from grants)", cost-fromGrants, fromGrants)
}

func runAllow(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "allow").withPolicy()
	cost := f.Int64("cost", 1, "tokens to take (above --capacity only with grants: durable storage)")
	requestID := f.String("request-id", "", "an idempotency key: a repeat with the same ID and cost charges nothing and prints the first outcome, saying it was replayed")
	f.input("--cost", pgratelimit.ErrInvalidCost, pgratelimit.ErrCostExceedsCapacity)
	f.input("--request-id", pgratelimit.ErrInvalidRequestID)
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key, id := pos[0], *requestID
		if id != "" {
			ctx = pgratelimit.WithRequestID(ctx, id)
		}
		r, err := l.AllowN(ctx, key, *cost)
		if errors.Is(err, pgratelimit.ErrRequestMismatch) {
			_, what := f.mismatchText(ctx, l, key, id)
			return 0, explainf(err, "request ID %q was used on %q for %s, not a charge of %d: nothing taken (a new charge needs a new ID)", id, key, what, *cost)
		}
		if err != nil {
			return 0, err
		}
		// The waits count from now (for a replay: the first outcome's
		// waits, counted from now).
		now := time.Now()
		var line string
		if r.Allowed {
			line = fmt.Sprintf("allowed: took %s from %q%s: %d of %d left%s, %s",
				human.Plural(*cost, "token", "tokens"), key, tookText(*cost, r.FromGrants), r.Remaining, r.Limit, grantedText(r), fullness(r, now))
		} else {
			line = fmt.Sprintf("denied: %q has %s, not the %d asked for (nothing taken); %s",
				key, holding(r), *cost, retryText(r, now))
		}
		switch {
		case f.json:
			j := newResultJSON(key, r)
			j.Allowed, j.Cost, j.RequestID = &r.Allowed, *cost, id
			f.printJSON(j)
		case r.Replayed:
			fmt.Fprintf(c.stdout, "replayed: request %q was already charged (nothing taken now); its outcome then: %s\n", id, line)
		default:
			fmt.Fprintln(c.stdout, line)
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
		key, before := pos[0], time.Now()
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		f.emit(newResultJSON(key, r), peekText(key, r, before))
		return exitOK, nil // peeking checks nothing, so it is never "denied"
	})
}

// peekText says what a peek found: the tokens (below zero: a debt), the
// grants, when a check of 1 may pass if not now, and when the bucket is
// full.
func peekText(key string, r pgratelimit.Result, now time.Time) string {
	state := ""
	switch {
	case r.Remaining >= r.Limit:
		state = " (full)"
	case r.Remaining == 0:
		state = " (empty)"
	case r.Remaining < 0:
		state = fmt.Sprintf(" (a debt of %d)", -r.Remaining)
	}
	s := fmt.Sprintf("%q has %d of %d tokens%s%s", key, r.Remaining, r.Limit, state, grantedText(r))
	var waits []string
	switch {
	case r.Allowed:
	case r.RetryAfter == pgratelimit.InfDuration:
		waits = append(waits, "refills alone will never cover a check of 1")
	case r.Remaining == 0 && r.RetryAfter == r.ResetAfter: // one refill fills it
		return s + ": full again " + human.In(r.ResetAfter, now)
	case r.Remaining == 0:
		waits = append(waits, "next token "+human.In(r.RetryAfter, now))
	default:
		waits = append(waits, "a check of 1 is allowed again "+human.In(r.RetryAfter, now))
	}
	if r.Remaining < r.Limit {
		waits = append(waits, fullness(r, now))
	}
	switch {
	case len(waits) == 0:
		return s
	case r.Allowed:
		return s + ", " + strings.Join(waits, ", ")
	}
	return s + ": " + strings.Join(waits, ", ")
}

func runRefund(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "refund").withPolicy()
	var n int64
	check := func(pos []string) error {
		var err error
		if n, err = strconv.ParseInt(pos[1], 10, 64); err != nil {
			return usagef("N, the tokens to give back, must be a whole number, got %q", pos[1])
		}
		return nil
	}
	f.input("N", pgratelimit.ErrInvalidCost)
	return f.withLimiter(ctx, args, 2, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key, before := pos[0], time.Now()
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
			fmt.Fprintf(c.stdout, "refunded %s to %q: it has %s, %s\n", human.Plural(n, "token", "tokens"), key, holding(r), fullness(r, before))
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
		f.emit(map[string]any{"key": pos[0], "reset": true}, fmt.Sprintf("reset: %q is full again (%d tokens)", pos[0], f.capacity))
		return exitOK, nil
	})
}

func runGrant(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "grant").withPolicy()
	expires := f.String("expires", "", "when the grant expires: an RFC 3339 time, a date (midnight UTC), or a duration from now such as 720h (default: never)")
	requestID := f.String("request-id", "", "an idempotency key (a payment's ID): a repeat with the same ID, N and --expires grants nothing more and prints the grant made the first time")
	var n int64
	var until time.Time
	check := func(pos []string) error {
		var err error
		if n, err = strconv.ParseInt(pos[1], 10, 64); err != nil {
			return usagef("N, the credits to grant, must be a whole number, got %q", pos[1])
		}
		// (A limiter without grants, ephemeral storage: the library refuses.)
		until, err = parseExpiry(*expires, time.Now())
		return err
	}
	f.input("N", pgratelimit.ErrInvalidCost)
	f.input("--request-id", pgratelimit.ErrInvalidRequestID)
	return f.withLimiter(ctx, args, 2, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key, id := pos[0], *requestID
		if id != "" {
			ctx = pgratelimit.WithRequestID(ctx, id)
		}
		g, err := l.Grant(ctx, key, n, until)
		if errors.Is(err, pgratelimit.ErrRequestMismatch) {
			_, what := f.mismatchText(ctx, l, key, id)
			return 0, explainf(err, "request ID %q was used on %q for %s, not this grant of %d: nothing granted (a repeat needs the same N and --expires, given as a time rather than a duration from now; a new grant needs a new ID)", id, key, what, n)
		}
		if errors.Is(err, pgratelimit.ErrGrantExpired) {
			return 0, explainf(err, "the grant's expiry, %s, is not in the future (by the database's clock): a grant is spent only before its expiry, so nothing was granted (give a later --expires)", until.Local().Format(time.DateTime+" MST"))
		}
		if err != nil {
			return 0, err
		}
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		if f.json {
			j := map[string]any{"key": key, "grant": grantJSONOf(g), "granted": r.Granted, "remaining": r.Remaining, "limit": r.Limit}
			if id != "" {
				j["request_id"] = id
			}
			f.printJSON(j)
			return exitOK, nil
		}
		repaid := ""
		if g.Amount < n {
			repaid = fmt.Sprintf(", %d of it repaid the key's debt", n-g.Amount)
		}
		fmt.Fprintf(c.stdout, "granted %d to %q (grant %d, %s%s): %d granted in all, %d of %d in the bucket\n",
			n, key, g.ID, expiryText(g.ExpiresAt), repaid, r.Granted, r.Remaining, r.Limit)
		return exitOK, nil
	})
}

func runBalance(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "balance").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key, before := pos[0], time.Now()
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
		bucket := fullness(r, before)
		if r.Remaining < 0 {
			bucket = fmt.Sprintf("a debt of %d, repaid by refills or grants; %s", -r.Remaining, bucket)
		}
		fmt.Fprintf(c.stdout, "%q: %d of %d tokens in the bucket (%s); %d granted in %s\n",
			key, r.Remaining, r.Limit, bucket, r.Granted, human.Plural(int64(len(gs)), "live grant", "live grants"))
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
	actual := f.Int64("actual", 0, "the actual cost (required; 0 or more): settling again at the same cost replays the first settlement, at another is refused")
	check := func([]string) error {
		if err := f.required("request-id", "the ID the estimate was taken with (allow --request-id)"); err != nil {
			return err
		}
		return f.required("actual", "the actual cost, 0 or more")
	}
	f.input("--actual", pgratelimit.ErrInvalidCost)
	f.input("--request-id", pgratelimit.ErrInvalidRequestID)
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key, id := pos[0], *requestID
		r, err := l.Settle(ctx, key, id, *actual)
		switch {
		case errors.Is(err, pgratelimit.ErrUnknownRequest):
			return 0, explainf(err, "no allowed charge with request ID %q is remembered for %q (never allowed, or past its retention): nothing to settle", id, key)
		case errors.Is(err, pgratelimit.ErrRequestMismatch):
			rec, what := f.mismatchText(ctx, l, key, id)
			if rec.Settled {
				return 0, explainf(err, "request %q of %q was settled already, at %d, not %d: a settlement is final (nothing changed)", id, key, rec.Actual, *actual)
			}
			return 0, explainf(err, "request ID %q names %s on %q: only a charge or a debit is settled (nothing changed)", id, what, key)
		case err != nil:
			return 0, err
		}
		switch {
		case f.json:
			j := newResultJSON(key, r)
			j.RequestID, j.Actual = id, actual
			f.printJSON(j)
		case r.Replayed:
			fmt.Fprintf(c.stdout, "replayed: request %q of %q was already settled at %d (nothing changed now); then it left %s%s\n",
				id, key, *actual, holding(r), debtText(r))
		default:
			fmt.Fprintf(c.stdout, "settled request %q of %q at %d: %s%s\n", id, key, *actual, holding(r), debtText(r))
		}
		return exitOK, nil
	})
}

func debtText(r pgratelimit.Result) string {
	if r.Remaining >= 0 {
		return ""
	}
	return ": checks are denied until refills or grants repay the debt"
}

func runLedger(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "ledger").withPolicy()
	since := f.String("since", "", "only entries at or after T: an RFC 3339 time, a date, or a duration before now such as 24h (default: all)")
	var from time.Time
	check := func([]string) (err error) {
		from, err = parseSince(*since, time.Now())
		return err
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		es, err := l.Ledger(ctx, pos[0], from)
		if err != nil {
			return 0, err
		}
		if f.json {
			out := []ledgerJSON{}
			for _, e := range es {
				out = append(out, ledgerJSON{e.ID, e.At.UTC(), e.Amount, e.GrantsAmount, e.Kind, e.RequestID, e.Balance, e.Granted})
			}
			f.printJSON(out)
			return exitOK, nil
		}
		if len(es) == 0 {
			fmt.Fprintf(c.stdout, "%q has no ledger entries (the ledger records limiters with Config.Ledger and the CLI's durable checks)\n", pos[0])
		}
		for _, e := range es {
			fmt.Fprintln(c.stdout, ledgerLine(e))
		}
		return exitOK, nil
	})
}

// ledgerJSON is a ledger entry for --json.
type ledgerJSON struct {
	ID           int64     `json:"id"`
	At           time.Time `json:"at"`
	Amount       int64     `json:"amount"`
	GrantsAmount int64     `json:"grants_amount"`
	Kind         string    `json:"kind"`
	RequestID    string    `json:"request_id,omitempty"`
	Balance      int64     `json:"balance"`
	Granted      int64     `json:"granted"`
}

// ledgerLine is a ledger entry for people: when, what, the change of the
// balance (and the part of it in grants), the balance after it (and the
// part of it in grants), and the request ID:
//
//	2026-11-25T09:58:03.123456Z  charge  -50 (grants -30)  balance 70 (granted 70)  request "call-1"
func ledgerLine(e pgratelimit.LedgerEntry) string {
	amount := fmt.Sprintf("%+d", e.Amount)
	if e.GrantsAmount != 0 {
		amount += fmt.Sprintf(" (grants %+d)", e.GrantsAmount)
	}
	balance := fmt.Sprintf("balance %d", e.Balance)
	if e.Granted != 0 {
		balance += fmt.Sprintf(" (granted %d)", e.Granted)
	}
	line := fmt.Sprintf("%-27s  %-6s  %s  %s", e.At.UTC().Format(time.RFC3339Nano), e.Kind, amount, balance)
	if e.RequestID != "" {
		line += "  request " + strconv.Quote(e.RequestID)
	}
	return line
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
