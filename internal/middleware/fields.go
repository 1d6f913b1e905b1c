package middleware

import (
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Fields are the rate-limit fields of the answer to a check, as every
// adapter sends them: HTTP and Connect as response headers, gRPC as header
// metadata (the names in lower case). httplimit's package doc describes
// them.
type Fields struct {
	// Policy is the value of RateLimit-Policy: every limiter's policy, in
	// the order given.
	Policy string
	// RateLimit is the value of RateLimit: the policy that denied the check
	// (the longest wait) or, when allowed, the one with the smallest share
	// of its quota left.
	RateLimit string
	// RetryAfter is the value of Retry-After for a denied check: whole
	// seconds, rounded up, at least 1. Empty when the check was allowed.
	RetryAfter string
}

// Pairs returns the fields as name, value pairs: RateLimit-Policy,
// RateLimit, and Retry-After when it is set.
func (f Fields) Pairs() []string {
	kv := []string{"RateLimit-Policy", f.Policy, "RateLimit", f.RateLimit}
	if f.RetryAfter != "" {
		kv = append(kv, "Retry-After", f.RetryAfter)
	}
	return kv
}

// Set sets the fields in h, replacing what h had of them.
func (f Fields) Set(h http.Header) {
	kv := f.Pairs()
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
}

// FieldsFor returns the fields of the answer to a check of limiters (in the
// order charged, as given to pgratelimit.AllowAll) that gave res.
func FieldsFor(limiters []*pgratelimit.Limiter, res pgratelimit.MultiResult) Fields {
	return FieldsForAll(limiters, nil, res)
}

// FieldsForAll is FieldsFor for a check of limiters and, when sem is not
// nil, a lease of sem (charged last): its policy is its prefix with q its
// Max, and RateLimit reports it, when it is the one, with r its free units
// (no w and no t: a semaphore has no window, and nothing resets).
func FieldsForAll(limiters []*pgratelimit.Limiter, sem *pgratelimit.Semaphore, res pgratelimit.MultiResult) Fields {
	policies := make([]string, len(limiters), len(limiters)+1)
	for i, l := range limiters {
		cfg := l.Config()
		w := CeilSeconds(l.Window(res.Results[i]))
		policies[i] = fmt.Sprintf("%s;q=%d;w=%d", SFString(cfg.Prefix), sfInt(cfg.Capacity), sfInt(w))
	}
	if sem != nil {
		policies = append(policies, fmt.Sprintf("%s;q=%d", SFString(sem.Config().Prefix), sfInt(sem.Config().Max)))
	}
	i := closest(res)
	top := res.Results[i]
	f := Fields{Policy: strings.Join(policies, ", ")}
	if i < len(limiters) {
		f.RateLimit = fmt.Sprintf("%s;r=%d;t=%d", SFString(limiters[i].Config().Prefix), sfInt(top.Remaining), sfInt(CeilSeconds(top.ResetAfter)))
	} else {
		f.RateLimit = fmt.Sprintf("%s;r=%d", SFString(sem.Config().Prefix), sfInt(top.Remaining))
	}
	if !res.Allowed {
		f.RetryAfter = strconv.FormatInt(max(CeilSeconds(res.RetryAfter), 1), 10)
	}
	return f
}

// closest is the index of the policy that RateLimit reports: when denied, the
// one that denied with the longest wait; when allowed, the one with the
// smallest share of its quota left (then the longest until full).
func closest(m pgratelimit.MultiResult) int {
	best := 0
	for i, r := range m.Results[1:] {
		i++
		b := m.Results[best]
		switch {
		case !m.Allowed:
			if (!r.Allowed && b.Allowed) || (r.Allowed == b.Allowed && r.RetryAfter > b.RetryAfter) {
				best = i
			}
		default:
			// r.Remaining/r.Limit < b.Remaining/b.Limit, without overflow.
			lhs := new(big.Int).Mul(big.NewInt(r.Remaining), big.NewInt(b.Limit))
			rhs := new(big.Int).Mul(big.NewInt(b.Remaining), big.NewInt(r.Limit))
			if c := lhs.Cmp(rhs); c < 0 || (c == 0 && r.ResetAfter > b.ResetAfter) {
				best = i
			}
		}
	}
	return best
}

// CeilSeconds rounds d up to whole seconds: never earlier than the truth.
func CeilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

// MaxSFInteger is the largest integer a Structured Field (RFC 8941) can carry:
// 15 digits. Larger numbers in RateLimit-Policy and RateLimit are sent as
// this, so that strict parsers accept the fields.
const MaxSFInteger = 999_999_999_999_999

func sfInt(n int64) int64 { return min(n, MaxSFInteger) }

// SFString encodes s as a Structured Field String (RFC 8941): printable
// ASCII, with '"' and '\' escaped; other bytes become '?'.
func SFString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
