package account

import (
	"cmp"
	"errors"
	"time"
)

// Errors of operations that cannot apply. The root package returns them as
// they are.
var (
	// ErrUnknownRequest: a settlement of a request ID that no live record
	// of a charge or debit names on the bucket.
	ErrUnknownRequest = errors.New("pgratelimit: no allowed check with this request ID is remembered for the key")
	// ErrRequestMismatch: a request ID reused on a bucket for another
	// operation or another amount than the one it names.
	ErrRequestMismatch = errors.New("pgratelimit: request ID reused with another operation or amount")
	// ErrGrantExpired: a grant whose expiry is not after the check's clock.
	ErrGrantExpired = errors.New("pgratelimit: grant expiry is not in the future")
)

// Kind is what an operation did, as the ledger and request records name it.
type Kind int8

// The kinds of operations and ledger entries. OpExpire and OpPlan are
// entries only: what the passage of time and a change of plan did.
const (
	OpCharge Kind = iota + 1
	OpDebit
	OpRefund
	OpSettle
	OpGrant
	OpReset
	OpExpire
	OpPlan
)

// String is the ledger's word for k.
func (k Kind) String() string {
	switch k {
	case OpCharge:
		return "charge"
	case OpDebit:
		return "debit"
	case OpRefund:
		return "refund"
	case OpSettle:
		return "settle"
	case OpGrant:
		return "grant"
	case OpReset:
		return "reset"
	case OpExpire:
		return "expire"
	case OpPlan:
		return "plan"
	}
	return "unknown"
}

// ParseKind is the Kind named s, or 0.
func ParseKind(s string) Kind {
	for k := OpCharge; k <= OpPlan; k++ {
		if k.String() == s {
			return k
		}
	}
	return 0
}

// Grant is a grant of credits beside a bucket.
type Grant struct {
	ID        int64
	Amount    int64     // what is left
	ExpiresAt time.Time // zero: never
	GrantedAt time.Time
	// Ledger says that the grant's expiry must be written to the ledger:
	// cleanup leaves it, once expired, until an operation has written it.
	Ledger bool
}

// Live says whether g can be spent at now: credits left, and now before its
// expiry (a grant is not live at the instant it expires).
func (g Grant) Live(now time.Time) bool {
	return g.Amount > 0 && (g.ExpiresAt.IsZero() || now.Before(g.ExpiresAt))
}

// CompareGrants orders grants as they are spent: soonest-expiring first,
// never-expiring last, equal expiries in the order granted (by ID).
func CompareGrants(a, b Grant) int {
	switch {
	case a.ExpiresAt.IsZero() != b.ExpiresAt.IsZero():
		if a.ExpiresAt.IsZero() {
			return 1
		}
		return -1
	case !a.ExpiresAt.Equal(b.ExpiresAt):
		return a.ExpiresAt.Compare(b.ExpiresAt)
	}
	return cmp.Compare(a.ID, b.ID)
}

// Outcome is what an operation reports of a bucket (the root package's
// Result).
type Outcome struct {
	Allowed    bool
	Limit      int64
	Remaining  int64
	Granted    int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	// FromGrants is what the live grants paid of an allowed charge or debit,
	// or of a settlement's difference (negative when it gave credits back
	// to grants); 0 for every other operation and for a denial. A record
	// keeps it, so a replay says it again.
	FromGrants int64
}

// Spent says where a charge or debit took its credits: how many from the
// bucket, and how many from each grant, in the order spent. Known is false
// for a record of an older release, which did not say.
type Spent struct {
	Known  bool
	Bucket int64
	Grants []Grant // ID, Amount taken, ExpiresAt, Ledger
}

// Record is what a request ID remembers on a bucket: the operation it named,
// its amount and its first outcome; for a charge or debit where the credits
// came from, and its settlement once settled; for a grant, the grant made.
type Record struct {
	Kind       Kind
	Amount     int64
	Outcome    Outcome
	Spent      Spent
	Grant      Grant
	Settled    bool
	Actual     int64
	Settlement Outcome
	CreatedAt  time.Time
	ExpiresAt  time.Time
}

// Live says whether r still names its request at now: past ExpiresAt it
// reads as missing (cleanup deletes it, which changes nothing), and the ID
// names a new request.
func (r Record) Live(now time.Time) bool { return now.Before(r.ExpiresAt) }

// Entry is a ledger entry: what an operation (or the passage of time) did
// to a balance.
type Entry struct {
	Kind Kind
	// Amount is what the balance (tokens plus live grants) gained; negative
	// when spent.
	Amount int64
	// GrantsAmount is the part of Amount that went to or came from grants;
	// the rest is the bucket's.
	GrantsAmount int64
	// Balance and Granted are the balance and its live grants afterwards.
	Balance, Granted int64
}

// State is what the engine holds of a key: its bucket as stored, its grants
// with credits left (any order), and the records of the request IDs it read.
type State struct {
	Bucket  Bucket
	Grants  []Grant
	Records map[string]Record
}

// Granted is the sum of the live amounts of gs at now, saturating.
func Granted(gs []Grant, now time.Time) int64 {
	var sum int64
	for _, g := range gs {
		if g.Live(now) {
			sum = AddSat(sum, g.Amount)
		}
	}
	return sum
}

// Written is the balance s held when its row was last written, as far as
// now can tell: its tokens then (Capacity, for a row that reads as a full
// bucket: past its expiry, or a placeholder) plus the amounts of its grants
// not yet written off, expired ones included. Where a Look at now finds
// less, the balance fell without an operation: grants expired, or a smaller
// plan clamped the tokens (refills only ever add).
func Written(p Policy, s State, now time.Time) int64 {
	tokens := s.Bucket.Tokens
	if !now.Before(s.Bucket.ExpiresAt) || s.Bucket.RefilledAt.IsZero() {
		tokens = p.Capacity
	}
	return AddSat(tokens, sumAmounts(s.Grants))
}
