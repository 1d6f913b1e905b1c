package lease

import (
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// Call is what one request's lease operations need beyond their charges
// (the operation's kind and limit are its Part's, the weight its charge's
// Cost), and where the Part puts their outcomes. It travels on each of the
// call's charges (engine.Charge.Call), so that one Part value serves the
// operations of every request of a kind and limit, and a batch reads and
// writes their leases in a few statements over arrays.
//
// The engine decides a request on one goroutine at a time, and its caller
// reads the outcomes once the engine has returned: a Call needs no lock.
type Call struct {
	// ID is the lease's ID: the ID a new lease gets (the request ID, or
	// one made for the call), or the ID of the lease released or extended.
	ID      string
	results []result
	one     [1]result // results' array for a call of one operation
}

type result struct {
	row engine.Row
	out Outcome
}

// callOf is the Call of charge c, or nil.
func callOf(c engine.Charge) *Call {
	call, _ := c.Call.(*Call)
	return call
}

// Outcome is the outcome of the lease operation on row r, as last decided
// (the lease found, also when the operation failed), and whether there is
// one.
func (c *Call) Outcome(r engine.Row) (Outcome, bool) {
	for _, x := range c.results {
		if x.row == r {
			return x.out, true
		}
	}
	return Outcome{}, false
}

// put records the outcome of the operation on r, replacing that of an
// earlier try.
func (c *Call) put(r engine.Row, o Outcome) {
	for i := range c.results {
		if c.results[i].row == r {
			c.results[i].out = o
			return
		}
	}
	if c.results == nil {
		c.results = c.one[:0]
	}
	c.results = append(c.results, result{row: r, out: o})
}
