package alert

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Config is an Observer's.
type Config struct {
	// Spec is the limiter's lines.
	Spec *Spec
	// Window is the alert period of a limiter that refills every
	// interval (see Window); 0: the periods of the charge's calendar
	// schedule.
	Window time.Duration
	// Emitted, if not nil, is told of every event the database confirmed
	// writing, before the transaction commits.
	Emitted func(ctx context.Context, prefix string, k Kind)
}

// Observer is the engine.Observer of a limiter with alerts: it writes the
// events of the charges it watches, once per line, key and period, in
// their transaction. Safe for concurrent use.
type Observer struct {
	cfg Config
	mem Memory
}

// New returns the observer of cfg.
func New(cfg Config) *Observer { return &Observer{cfg: cfg} }

var _ engine.Observer = (*Observer)(nil)

// attemptKey is the key (engine.Attempt.Local) of the alert state of an
// attempt, which every alert observer of it shares: limiters of one prefix
// share a key's alert state, and a key's events are decided in the order
// of its charges, whichever limiter made them.
type attemptKey struct{}

// stateID names a key's alert state in one period.
type stateID struct {
	prefix, key string
	start       int64 // Unix microseconds
}

// candidate is a charge that may fire lines: those of mask not yet fired.
type candidate struct {
	obs        *Observer
	id         stateID
	start, end time.Time
	mask       uint64
	bal        Balance // after the charge (at it, for a denial)
	reqID      string
}

// attemptState is what the alert observers of an attempt found.
type attemptState struct {
	cands    []candidate
	ids      []stateID            // distinct, in the order first seen
	read     map[stateID][]string // the labels fired, as read
	fired    map[stateID][]string // the labels fired, as written (Write)
	followed bool
	written  bool
	learned  bool
}

func stateOf(a *engine.Attempt) *attemptState {
	return a.Local(attemptKey{}, func() any { return &attemptState{} }).(*attemptState)
}

// Observe notes a charge that crosses a line, or a charge denied (for
// Exhausted), unless every line it could fire is known to have fired in
// its period. A replay changes nothing and fires nothing.
func (o *Observer) Observe(a *engine.Attempt, q *engine.Request, c engine.Charge, before account.Outcome, ch account.Change, taken bool) {
	if ch.Replayed {
		return
	}
	var mask uint64
	bal := Of(ch.Outcome)
	switch {
	case taken:
		mask = o.cfg.Spec.Crossed(o.unseen(a, c, Of(before)), bal)
	case !ch.Allowed && q.Kind == account.OpCharge:
		mask, bal = o.cfg.Spec.Denied(), Of(before)
	}
	if mask == 0 {
		return
	}
	start, end := Period(c.Policy.Schedule, o.cfg.Window, a.Now())
	if mask &^= o.mem.Known(c.Row.Prefix, c.Row.Key, start); mask == 0 {
		return
	}
	st := stateOf(a)
	id := stateID{prefix: c.Row.Prefix, key: c.Row.Key, start: start.UnixMicro()}
	if !slices.Contains(st.ids, id) {
		st.ids = append(st.ids, id)
	}
	st.cands = append(st.cands, candidate{obs: o, id: id, start: start, end: end, mask: mask, bal: bal, reqID: q.ID})
}

// unseen is before, the balance c's account holds just before c, raised to
// what its row held when last written if that was more: a balance that fell
// with no operation (grants that expired, a smaller plan that clamped the
// tokens) crossed its Below lines unseen, and the first operation taken
// after it tells them, if the balance it leaves is still at or below them.
// The bucket's tokens (Used lines) stay before's.
func (o *Observer) unseen(a *engine.Attempt, c engine.Charge, before Balance) Balance {
	if w := account.Written(c.Policy, a.Account(c.Row), a.Now()); w > before.Total() {
		before.Granted = account.AddSat(before.Granted, account.AddSat(w, -before.Total())) // Total >= -MaxInt64
	}
	return before
}

// Follow reads the alert state of every key and period a charge may fire
// lines of, once per attempt (whichever alert observer is asked first).
// What a transaction of its own reads is committed, so each observer
// remembers it (Memory); a caller's transaction may hold its own
// uncommitted state, which is not remembered.
func (o *Observer) Follow(a *engine.Attempt) []engine.Stmt {
	st := stateOf(a)
	if st.followed || len(st.cands) == 0 {
		return nil
	}
	st.followed = true
	st.read = make(map[stateID][]string, len(st.ids))
	stmts := make([]engine.Stmt, len(st.ids))
	for i, id := range st.ids {
		var start time.Time
		for _, c := range st.cands {
			if c.id == id {
				start = c.start
				break
			}
		}
		stmts[i] = engine.Stmt{SQL: sqlgen.Alerts.ReadState, Args: []any{id.prefix, id.key, timeArg(start)},
			Scan: func(rs engine.RowScanner) error {
				for rs.Next() {
					var labels string
					if err := rs.Scan(&labels); err != nil {
						return err
					}
					st.read[id] = strings.Fields(labels)
				}
				if err := rs.Err(); err != nil {
					return err
				}
				if a.Own() {
					st.learn(id, start)
				}
				return nil
			}}
	}
	return stmts
}

// learn tells the observers of the candidates of id what the database
// holds of it.
func (st *attemptState) learn(id stateID, start time.Time) {
	for _, c := range st.cands {
		if c.id == id {
			c.obs.mem.Learn(id.prefix, id.key, start, c.obs.cfg.Spec.Mask(st.read[id]))
		}
	}
}

// Write returns the statements that write the events of the lines that
// fire, in the order of the charges, and the keys' new alert state, once
// per attempt; and it has the engine notify each prefix (delivered on
// commit).
func (o *Observer) Write(a *engine.Attempt) []engine.Stmt {
	st := stateOf(a)
	if st.written || !st.followed {
		return nil
	}
	st.written = true
	fired := make(map[stateID][]string, len(st.ids))
	st.fired = fired
	var events, states []engine.Stmt
	for _, c := range st.cands {
		have := fired[c.id]
		if have == nil {
			have = slices.Clone(st.read[c.id])
		}
		c.obs.cfg.Spec.Each(c.mask, func(_ int, l Line) {
			if slices.Contains(have, l.Label()) {
				return
			}
			have = append(have, l.Label())
			events = append(events, c.obs.event(a, c, l))
		})
		fired[c.id] = have
	}
	for _, id := range st.ids {
		if len(fired[id]) == len(st.read[id]) {
			continue // nothing new
		}
		c := st.cands[slices.IndexFunc(st.cands, func(c candidate) bool { return c.id == id })]
		labels := slices.Clone(fired[id])
		slices.Sort(labels)
		states = append(states, engine.Stmt{SQL: sqlgen.Alerts.WriteState,
			Args: []any{id.prefix, id.key, timeArg(c.start), timeArg(c.end), strings.Join(labels, " ")}})
		a.Notify(sqlgen.EventsChannel, id.prefix)
	}
	return append(states, events...)
}

// Committed tells the observers of a's candidates the lines a fired, once
// a has committed (a transaction that rolls back must not make them skip a
// line that has not fired): the next charge that could fire only those
// needs no read, and a line whose state is deleted by hand stays fired for
// the process, as docs/alerts.md says.
func (o *Observer) Committed(a *engine.Attempt) {
	st := stateOf(a)
	if st.learned || st.fired == nil {
		return
	}
	st.learned = true
	for _, c := range st.cands {
		c.obs.mem.Learn(c.id.prefix, c.id.key, c.start, c.obs.cfg.Spec.Mask(st.fired[c.id]))
	}
}

// event is the statement that writes the event of line l for c.
func (o *Observer) event(a *engine.Attempt, c candidate, l Line) engine.Stmt {
	return engine.Stmt{SQL: sqlgen.Alerts.InsertEvent,
		Args: []any{l.Kind.String(), c.id.prefix, c.id.key, l.Threshold(), c.bal.Total(), c.bal.Tokens, o.cfg.Spec.Capacity,
			timeArg(c.start), timeArg(c.end), timeArg(a.Now()), c.reqID},
		Scan: func(rs engine.RowScanner) error {
			for rs.Next() {
				if o.cfg.Emitted != nil {
					o.cfg.Emitted(context.Background(), c.id.prefix, l.Kind)
				}
			}
			return rs.Err()
		}}
}

// timeArg is t as the statements take times: text, UTC, to the
// microsecond.
func timeArg(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}
