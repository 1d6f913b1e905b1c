package engine

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Request IDs (idempotency keys): an allowed charge, debit, refund or grant
// that carries one leaves a row in pgratelimit_requests, per bucket, in its
// own transaction, with what it did and the outcome it got (its record). A
// later request with the same ID on the same bucket finds that row (read in
// the statements that lock the buckets, so in the same round trip), and the
// account model replays it. Every writer of a bucket's request rows holds
// the bucket's row lock, so two requests with one ID cannot both apply: the
// second waits for the first, then reads its row.

// recordWrite is a request record to write: new, or just settled.
type recordWrite struct {
	row Row
	id  string
	rec account.Record
}

// recordDetail is what a request row keeps in its detail column, JSON: the
// parts of the record that have no column of their own.
type recordDetail struct {
	Limit      int64          `json:"l"`
	ResetAfter time.Duration  `json:"r"`
	FromGrants int64          `json:"f,omitempty"`
	Known      bool           `json:"k,omitempty"`
	Bucket     int64          `json:"b,omitempty"`
	Grants     []detailGrant  `json:"g,omitempty"`
	Settlement *detailOutcome `json:"s,omitempty"`
	Grant      *detailGrant   `json:"n,omitempty"`
}

type detailGrant struct {
	ID        int64      `json:"i"`
	Amount    int64      `json:"a"`
	ExpiresAt *time.Time `json:"e,omitempty"`
	GrantedAt *time.Time `json:"t,omitempty"`
	Ledger    bool       `json:"l,omitempty"`
}

type detailOutcome struct {
	Limit      int64         `json:"l"`
	Remaining  int64         `json:"m"`
	Granted    int64         `json:"g"`
	ResetAfter time.Duration `json:"r"`
	FromGrants int64         `json:"f,omitempty"`
}

func toDetailGrant(g account.Grant) detailGrant {
	d := detailGrant{ID: g.ID, Amount: g.Amount, Ledger: g.Ledger}
	if !g.ExpiresAt.IsZero() {
		e := g.ExpiresAt.UTC()
		d.ExpiresAt = &e
	}
	if !g.GrantedAt.IsZero() {
		t := g.GrantedAt.UTC()
		d.GrantedAt = &t
	}
	return d
}

func (d detailGrant) grant() account.Grant {
	g := grantOf(d.ID, d.Amount, d.ExpiresAt, d.Ledger)
	if d.GrantedAt != nil {
		g.GrantedAt = *d.GrantedAt
	}
	return g
}

// values are the columns of w's row in the requests table.
func (w recordWrite) values() []any {
	r := w.rec
	d := recordDetail{Limit: r.Outcome.Limit, ResetAfter: r.Outcome.ResetAfter, FromGrants: r.Outcome.FromGrants, Known: r.Spent.Known, Bucket: r.Spent.Bucket}
	for _, g := range r.Spent.Grants {
		d.Grants = append(d.Grants, toDetailGrant(g))
	}
	settled := int64(-1)
	if r.Settled {
		settled = r.Actual
		s := r.Settlement
		d.Settlement = &detailOutcome{Limit: s.Limit, Remaining: s.Remaining, Granted: s.Granted, ResetAfter: s.ResetAfter, FromGrants: s.FromGrants}
	}
	if r.Kind == account.OpGrant {
		g := toDetailGrant(r.Grant)
		d.Grant = &g
	}
	detail, _ := json.Marshal(d) // of plain numbers, times and slices: cannot fail
	return []any{w.row.Prefix, w.row.Key, w.id, r.Kind.String(), r.Amount, r.Outcome.Remaining, r.Outcome.Granted,
		settled, string(detail), r.CreatedAt, r.ExpiresAt}
}

// ScanRecord reads a request row (after its prefix, key and ID) into a
// record; a row of an older release (no detail) says nothing of where its
// charge came from, and its Limit is limit.
func ScanRecord(rs RowScanner, dest []any, limit int64) (account.Record, error) {
	var (
		kind          string
		cost, rem, gr int64
		settled       *int64
		detail        *string
		created, exp  time.Time
	)
	if err := rs.Scan(append(dest, &kind, &cost, &rem, &gr, &settled, &detail, &created, &exp)...); err != nil {
		return account.Record{}, err
	}
	r := account.Record{Kind: account.ParseKind(kind), Amount: cost, CreatedAt: created, ExpiresAt: exp,
		Outcome: account.Outcome{Allowed: true, Limit: limit, Remaining: rem, Granted: gr}}
	var d recordDetail
	if detail != nil {
		if err := json.Unmarshal([]byte(*detail), &d); err != nil {
			return r, fmt.Errorf("pgratelimit: request row %q: %w", *detail, err)
		}
		r.Outcome.Limit, r.Outcome.ResetAfter, r.Outcome.FromGrants = d.Limit, d.ResetAfter, d.FromGrants
		r.Spent = account.Spent{Known: d.Known, Bucket: d.Bucket}
		for _, g := range d.Grants {
			r.Spent.Grants = append(r.Spent.Grants, g.grant())
		}
		if d.Grant != nil {
			r.Grant = d.Grant.grant()
		}
	}
	if settled != nil {
		r.Settled, r.Actual = true, *settled
		if s := d.Settlement; s != nil {
			r.Settlement = account.Outcome{Allowed: true, Limit: s.Limit, Remaining: s.Remaining, Granted: s.Granted, ResetAfter: s.ResetAfter, FromGrants: s.FromGrants}
		}
	}
	return r, nil
}

// scanIDs reads request rows of storage s into a's accounts.
func (a *Attempt) scanIDs(s Storage) func(RowScanner) error {
	return func(rs RowScanner) error {
		for rs.Next() {
			r, id := Row{Storage: s}, ""
			rec, err := ScanRecord(rs, []any{&r.Prefix, &r.Key, &id}, 0)
			if err != nil {
				return err
			}
			st := a.state[r]
			if st == nil {
				continue // a row this attempt does not hold
			}
			if rec.Outcome.Limit == 0 {
				rec.Outcome.Limit = a.capacityOf(r)
			}
			if st.Records == nil {
				st.Records = make(map[string]account.Record, 1)
			}
			st.Records[id] = rec
		}
		return rs.Err()
	}
}

// capacityOf is the Capacity of the first charge of r among a's requests.
func (a *Attempt) capacityOf(r Row) int64 {
	for _, q := range a.reqs {
		for _, c := range q.Charges {
			if c.Row == r {
				return c.Policy.Capacity
			}
		}
	}
	return 0
}

// readIDs returns the statements that read the request rows of a's requests
// with IDs, per table.
func (a *Attempt) readIDs() []Stmt {
	var stmts []Stmt
	for s := range byStorage(a.rows) {
		var vals [][]any
		for _, q := range a.reqs {
			if q.ID == "" {
				continue
			}
			for _, c := range q.Charges {
				if c.Row.Storage == s {
					vals = append(vals, []any{c.Row.Prefix, c.Row.Key, q.ID})
				}
			}
		}
		if len(vals) > 0 {
			stmts = append(stmts, a.shape.Values(sqlgen.Requests.Read, vals, a.scanIDs(s))...)
		}
	}
	return stmts
}
