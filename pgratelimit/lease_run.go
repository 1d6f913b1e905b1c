package pgratelimit

import (
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// run runs q as s's operation: in s's transaction (In), else in one of the
// client's, coalesced unless disabled. what names it in errors (made only
// when they can say it: a coalesced batch's errors name no call).
func (s *Semaphore) run(q *engine.Request, what func() string) error {
	set := s.settings()
	switch {
	case s.tx != nil:
		return s.client.runIn(q.Ctx, s.tx, q, set, what())
	case s.cfg.DisableCoalescing:
		return s.client.run(q, set, nil, false, what())
	}
	return s.client.run(q, set, nil, true, "")
}
