package engine

import (
	"slices"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Parts and observers are how capabilities beyond a balance join the one
// transaction shape without flags in the engine: a Part decides charges of
// its own kind (a concurrency lease: internal/lease) on rows the engine
// locks, all or nothing with a request's other charges; an Observer watches
// the balance charges it is attached to as they are decided (usage alerts:
// internal/alert). Each brings its own statements: reads in the first round
// trip, after the locks; for an observer, reads between decision and close,
// in a round trip of their own only when it has any; writes before COMMIT.

// Part decides the charges of a kind other than a balance's (Charge.Part):
// the engine locks their rows as any bucket's (the row is then the key's
// lock: its balance is not touched) and leaves the rest to the Part.
type Part interface {
	// Read returns the statements, run in the first round trip after the
	// rows are locked, that read what Decide needs of cs, the charges of
	// the attempt's requests that are this part's (a holds their rows,
	// unless deferred).
	Read(a *Attempt, cs []Charge) []Stmt
	// Decide decides c, a charge of q: its outcome, and whether it may be
	// taken (Outcome.Allowed). It changes nothing yet; an error fails q
	// alone.
	Decide(a *Attempt, q *Request, c Charge) (account.Outcome, error)
	// Take makes the decision of c, allowed with all of q's other
	// charges, q's own: it notes what to write.
	Take(a *Attempt, q *Request, c Charge)
	// Write returns the statements that write what Take noted, before
	// COMMIT.
	Write(a *Attempt) []Stmt
}

// Observer watches the balance charges it is attached to
// (Charge.Observer).
type Observer interface {
	// Observe is told that c of q was decided: before is what a check of
	// c's cost would have found just before it, ch what the account model
	// decided, taken whether q as a whole was taken.
	Observe(a *Attempt, q *Request, c Charge, before account.Outcome, ch account.Change, taken bool)
	// Follow returns statements to run once every request of a is
	// decided, before a closes (a round trip of their own, only when some
	// observer has any), reading what Write needs.
	Follow(a *Attempt) []Stmt
	// Write returns the statements to write before COMMIT.
	Write(a *Attempt) []Stmt
	// Committed is told that a, a transaction of its own, committed
	// (never for the caller's transaction, whose end the engine does not
	// see).
	Committed(a *Attempt)
}

// Now is the clock of a's decisions: the database's, read after the locks,
// or the limiters' Config.Clock.
func (a *Attempt) Now() time.Time { return a.now }

// Held says whether a holds r's lock (r was not skipped).
func (a *Attempt) Held(r Row) bool { return a.state[r] != nil }

// Account is r's account as a's decisions so far left it (as locked, for
// the first request on r); the zero State when a does not hold r.
func (a *Attempt) Account(r Row) account.State {
	if st := a.state[r]; st != nil {
		return *st
	}
	return account.State{}
}

// Data is the leases column of r as a's decisions so far left it (the data
// of the Part that decides r's charges: a key's concurrency leases, as
// internal/lease encodes them), "" when NULL or when a does not hold r. The
// engine reads it with the lock, in the same statement.
func (a *Attempt) Data(r Row) string { return a.data[r] }

// SetData has a write data as r's leases column ("": NULL) when it closes,
// and keep r's row until keep at least (its expiry moves to keep when
// earlier): a Part's write, from its Write, of a row it decided and a
// holds, whose balance no charge of a changes.
func (a *Attempt) SetData(r Row, data string, keep time.Time) {
	if a.data == nil {
		a.data = make(map[Row]string, len(a.rows))
	}
	if a.keep == nil {
		a.keep = make(map[Row]time.Time, len(a.rows))
	}
	a.data[r], a.keep[r] = data, keep
}

// Notify has a send a notification on channel with payload, delivered by
// PostgreSQL when a commits (never if it does not), once however often a
// transaction asks. A part or an observer calls it from Write; the engine
// sends every notification of a in one statement before COMMIT.
//
// The COMMIT of a transaction that notified waits for PostgreSQL's
// notification queue lock, one for the whole cluster, which every other
// committing notifier holds in turn: in a transaction of its own, that
// statement also lifts the lock_timeout the transaction set for its row
// locks (InsertGuard, Config.LockTimeout), so that a busy queue delays the
// COMMIT (within the context) but never fails it as a lock timeout.
func (a *Attempt) Notify(channel, payload string) {
	for _, n := range a.notes {
		if n[0] == channel && n[1] == payload {
			return
		}
	}
	a.notes = append(a.notes, []any{channel, payload})
}

// Own says whether a is a transaction of its own (else the caller's).
func (a *Attempt) Own() bool { return a.own }

// Shape is the statement shape of a's transaction: a part's or an
// observer's statements over rows of values go through its Values, so that
// many rows go as arrays where the transaction's own statements do.
func (a *Attempt) Shape() Shape { return a.shape }

// Local returns the value that owner (a Part or an Observer) keeps in a,
// made by mk the first time: its state for one try of a transaction.
func (a *Attempt) Local(owner any, mk func() any) any {
	if v, ok := a.locals[owner]; ok {
		return v
	}
	if a.locals == nil {
		a.locals = make(map[any]any, 1)
	}
	v := mk()
	a.locals[owner] = v
	return v
}

// parts returns the distinct parts of a's charges, in the order they
// first come. A transaction has few: a list finds them sooner than a map.
func (a *Attempt) parts() []Part {
	var out []Part
	for _, q := range a.reqs {
		for _, c := range q.Charges {
			if c.Part != nil && !slices.Contains(out, c.Part) {
				out = append(out, c.Part)
			}
		}
	}
	return out
}

// chargesOf returns the charges of a's requests that are p's, in order.
func (a *Attempt) chargesOf(p Part) []Charge {
	var out []Charge
	for _, q := range a.reqs {
		for _, c := range q.Charges {
			if c.Part == p {
				out = append(out, c)
			}
		}
	}
	return out
}

// observers returns the distinct observers of a's charges, in the order
// they first come.
func (a *Attempt) observers() []Observer {
	var out []Observer
	for _, q := range a.reqs {
		for _, c := range q.Charges {
			if c.Observer != nil && !slices.Contains(out, c.Observer) {
				out = append(out, c.Observer)
			}
		}
	}
	return out
}

// committed tells a's observers that a committed.
func (a *Attempt) committed() {
	for _, o := range a.observers() {
		o.Committed(a)
	}
}

// follow returns the statements of a's observers to run between decision
// and close.
func (a *Attempt) follow() []Stmt {
	var stmts []Stmt
	for _, o := range a.observers() {
		stmts = append(stmts, o.Follow(a)...)
	}
	return stmts
}
