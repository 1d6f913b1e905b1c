package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/internal/notify"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// eventsMore ends events' help: what a line says, and what --follow and
// --json do.
const eventsMore = `Each line is an event: its ID, when its charge happened (UTC), the prefix and key, the
kind and its line (used 80%, below 100, exhausted -), the balance after the charge (the
bucket's remaining/capacity), the alert period, the request ID, and when a Consumer delivered
it, or "pending" with the failed attempts and the last error.
--follow polls every 500ms (sooner when a LISTEN on pgratelimit_events wakes it) and looks
again at the last 100 IDs, which may commit out of order; Ctrl-C stops it (exit status 0).
--json prints one JSON object per event per line, with --follow too.
`

// The --follow loop's timing: how often it polls, and how far behind the
// newest ID printed it looks again (an event's ID is taken when it is
// written, and its transaction may commit after those of later IDs).
const (
	eventPollInterval = 500 * time.Millisecond
	followWindow      = 100
)

// maxEventLimit is events.List's largest Limit.
const maxEventLimit = 10000

// runEvents is `pgratelimit events`: the usage alerts of pgratelimit_events
// (Config.Alerts), newest last; with --follow, then each new one as it is
// written, until interrupted.
func runEvents(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "events")
	var filter events.Filter
	f.StringVar(&filter.Prefix, "prefix", "", "only the events of limiter prefix `P` (default: any)")
	f.StringVar(&filter.Key, "key", "", "only the events of key `K` (default: any)")
	since := f.String("since", "", "only events at or after `T`: an RFC 3339 time, a date, or a duration before now such as 24h (default: all)")
	f.IntVar(&filter.Limit, "limit", 100, fmt.Sprintf("print the newest N events (at most %d)", maxEventLimit))
	follow := f.Bool("follow", false, "then wait for new events and print each as it is written, until Ctrl-C")
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	if filter.Limit < 1 || filter.Limit > maxEventLimit {
		return f.fail(usagef("--limit must be between 1 and %d, got %d", maxEventLimit, filter.Limit))
	}
	var err error
	if filter.Since, err = parseSince(*since, time.Now()); err != nil {
		return f.fail(err)
	}
	pool, err := f.pool(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer pool.Close()
	qctx, cancel := f.withTimeout(ctx)
	evs, err := events.List(qctx, pool, filter)
	cancel()
	if err != nil {
		return f.fail(err)
	}
	p := &eventPrinter{f: f, seen: make(map[int64]bool)}
	if len(evs) == filter.Limit {
		p.floor = evs[0].ID // the older events were left out on purpose
	}
	p.print(evs)
	if !*follow {
		if len(evs) == 0 && !f.json {
			fmt.Fprintf(c.stdout, "no events%s (limiters with Config.Alerts write them)\n", filterText(filter))
		}
		return exitOK
	}
	if len(evs) == 0 && !f.json {
		fmt.Fprintf(c.stderr, "pgratelimit events: no events%s yet; waiting for new ones (Ctrl-C to stop)\n", filterText(filter))
	}
	return f.followEvents(ctx, pool, filter, p)
}

// parseSince reads --since: a duration before now, an RFC 3339 time or a
// date (midnight UTC); "" is the zero time (all).
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	t, err := parseExpiry(s, now)
	if err != nil {
		return time.Time{}, usagef("--since must be an RFC 3339 time, a date or a duration, got %q", s)
	}
	return t, nil
}

// filterText says what filter selects, for "no events ...".
func filterText(filter events.Filter) string {
	var of []string
	if filter.Prefix != "" {
		of = append(of, "prefix "+strconv.Quote(filter.Prefix))
	}
	if filter.Key != "" {
		of = append(of, "key "+strconv.Quote(filter.Key))
	}
	var s string
	if len(of) > 0 {
		s = " for " + strings.Join(of, ", ")
	}
	if !filter.Since.IsZero() {
		s += " since " + filter.Since.UTC().Format(time.RFC3339)
	}
	return s
}

// eventPrinter prints events once each: --follow reads some again.
type eventPrinter struct {
	f *flags
	// last is the highest ID printed, and seen the IDs printed above
	// last-followWindow. IDs below floor are not printed: the first
	// listing left them out (--limit).
	last, floor int64
	seen        map[int64]bool
}

// print prints the events of evs not printed yet, in their order.
func (p *eventPrinter) print(evs []events.Event) {
	for _, e := range evs {
		if p.seen[e.ID] || e.ID < p.floor || e.ID <= p.last-followWindow {
			continue
		}
		p.seen[e.ID] = true
		p.last = max(p.last, e.ID)
		if p.f.json {
			p.f.printJSON(eventJSONOf(e))
		} else {
			fmt.Fprintln(p.f.c.stdout, eventLine(e))
		}
	}
	for id := range p.seen {
		if id <= p.last-followWindow {
			delete(p.seen, id)
		}
	}
}

// poll prints the events written since the last poll: those above the
// last ID printed less followWindow, not printed yet, a page of
// maxEventLimit at a time.
func (p *eventPrinter) poll(ctx context.Context, pool *pgxpool.Pool, filter events.Filter) error {
	for {
		filter.Limit, filter.AfterID = maxEventLimit, p.last-followWindow
		// (At AfterID 0 or below, events.List returns the newest events
		// instead, the same ones unless more than a page came at once.)
		evs, err := events.List(ctx, pool, filter)
		if err != nil {
			return err
		}
		p.print(evs)
		if len(evs) < filter.Limit || filter.AfterID <= 0 {
			return nil
		}
	}
}

// followEvents polls for new events every eventPollInterval, and when a
// notification says some were written, until ctx is done (exit status 0).
// A failed poll is said on stderr, once until one succeeds again.
func (f *flags) followEvents(ctx context.Context, pool *pgxpool.Pool, filter events.Filter, p *eventPrinter) int {
	wake := make(chan struct{}, 1)
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	cfg := pool.Config().ConnConfig
	wg.Go(func() { listenEvents(lctx, cfg, filter.Prefix, wake) })
	tick := time.NewTicker(eventPollInterval)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		case <-wake:
		}
		qctx, cancel := f.withTimeout(ctx)
		err := p.poll(qctx, pool, filter)
		cancel()
		switch {
		case ctx.Err() != nil:
			return exitOK
		case err != nil && !failing:
			fmt.Fprintf(f.c.stderr, "pgratelimit events: %s; trying again every %s\n", f.explain(err), eventPollInterval)
		case err == nil && failing:
			fmt.Fprintln(f.c.stderr, "pgratelimit events: reading events again")
		}
		failing = err != nil
	}
}

// listenEvents sends on wake (without blocking) whenever a notification on
// the pgratelimit_events channel says events of prefix (any, if "") were
// written, on a connection of its own made from cfg (notify.Listen), until
// ctx is done. It connects again every few seconds after an error; behind
// PgBouncer in transaction mode no notification arrives, and the poll alone
// finds the events.
func listenEvents(ctx context.Context, cfg *pgx.ConnConfig, prefix string, wake chan<- struct{}) {
	l := notify.Listener{Channel: sqlgen.EventsChannel, Got: func(payload string) {
		if prefix == "" || payload == prefix {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}}
	for {
		if err := notify.Listen(ctx, cfg, l); errors.Is(err, notify.ErrPooler) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// eventJSON is an event for --json. Fraction is a used event's line, Level
// a below event's; DeliveredAt is null while it is pending.
type eventJSON struct {
	ID          int64      `json:"id"`
	At          time.Time  `json:"at"`
	Prefix      string     `json:"prefix"`
	Key         string     `json:"key"`
	Kind        string     `json:"kind"`
	Fraction    *float64   `json:"fraction,omitempty"`
	Level       *int64     `json:"level,omitempty"`
	Balance     int64      `json:"balance"`
	Remaining   int64      `json:"remaining"`
	Capacity    int64      `json:"capacity"`
	PeriodStart time.Time  `json:"period_start"`
	PeriodEnd   time.Time  `json:"period_end"`
	RequestID   string     `json:"request_id,omitempty"`
	DeliveredAt *time.Time `json:"delivered_at"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
}

func eventJSONOf(e events.Event) eventJSON {
	j := eventJSON{ID: e.ID, At: e.At.UTC(), Prefix: e.Prefix, Key: e.Key, Kind: string(e.Kind), Balance: e.Balance,
		Remaining: e.Remaining, Capacity: e.Capacity, PeriodStart: e.PeriodStart.UTC(), PeriodEnd: e.PeriodEnd.UTC(),
		RequestID: e.RequestID, Attempts: e.Attempts, LastError: e.LastError}
	switch e.Kind {
	case events.Used:
		j.Fraction = &e.Fraction
	case events.Below:
		j.Level = &e.Level
	}
	if !e.DeliveredAt.IsZero() {
		t := e.DeliveredAt.UTC()
		j.DeliveredAt = &t
	}
	return j
}

// eventTime is how an event's moments are shown: UTC, to the millisecond.
const eventTime = "2006-01-02T15:04:05.000Z07:00"

// eventLine is an event for people: its ID, when, the prefix and key, the
// kind and its line, the balance (and the bucket's part of it of its
// capacity), the period, the request ID, and its delivery:
//
//	17  2026-11-25T09:58:03.123Z  api-calls "customer-1"  used 80%  balance 200 (200/1000)  period 2026-11-01T00:00:00Z/2026-12-01T00:00:00Z  request "call-1"  delivered 2026-11-25T09:58:03.140Z
//	18  2026-11-25T10:02:41.001Z  api-calls "customer-1"  exhausted -  balance 0 (0/1000)  period 2026-11-01T00:00:00Z/2026-12-01T00:00:00Z  pending (2 attempts, last error "smtp: timeout")
func eventLine(e events.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d  %s  %s %q  %s %s  balance %d (%d/%d)  period %s/%s", e.ID, e.At.UTC().Format(eventTime), e.Prefix, e.Key,
		e.Kind, eventThreshold(e), e.Balance, e.Remaining, e.Capacity,
		e.PeriodStart.UTC().Format(time.RFC3339Nano), e.PeriodEnd.UTC().Format(time.RFC3339Nano))
	if e.RequestID != "" {
		fmt.Fprintf(&b, "  request %q", e.RequestID)
	}
	switch {
	case !e.DeliveredAt.IsZero():
		b.WriteString("  delivered " + e.DeliveredAt.UTC().Format(eventTime))
	case e.Attempts > 0:
		fmt.Fprintf(&b, "  pending (%s, last error %q)", human.Plural(int64(e.Attempts), "attempt", "attempts"), e.LastError)
	default:
		b.WriteString("  pending")
	}
	return b.String()
}

// eventThreshold is an event's line: "80%" for used, the level for below,
// "-" for exhausted.
func eventThreshold(e events.Event) string {
	switch e.Kind {
	case events.Used:
		return human.Percent(e.Fraction)
	case events.Below:
		return strconv.FormatInt(e.Level, 10)
	}
	return "-"
}
