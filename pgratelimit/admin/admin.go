// Package admin reads what tools show of pgratelimit's limits as data: the
// policies that limiters record (one row per prefix and distinct policy,
// with when a process last started running it) and the per-key overrides
// (Limiter.SetOverride), the stored rows of a prefix's keys (Keys) and
// how many of them are near or at their limit (CountKeys), and what the
// database remembers of a key's request IDs (Requests, LookupRequest). The CLI and the
// operator UI (package ui) read them here; an application needs it only
// for tools of its own. It reads, and writes nothing: overrides are set and
// cleared, and keys charged, granted and reset, through a Limiter, so that
// the key's bucket changes in the same transaction.
package admin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Policy is a policy a limiter ran on a prefix, as it recorded it at its
// first operation in a process.
type Policy struct {
	Prefix string
	// Storage is "durable" or "ephemeral".
	Storage          string
	Capacity, Refill int64
	// Schedule is "every " and the Interval (Go's time.Duration form), or
	// "calendar ", the Calendar's Every and Location, and " anchor " and
	// its Anchor (RFC 3339) when it has one.
	Schedule string
	// Features are the options that change what a key holds, of "grants",
	// "ledger", "alerts" and "overrides", in that order.
	Features []string
	// FirstSeen is when a process first recorded it, LastSeen the last
	// time one did (processes record at start, not per check: an instance
	// that runs for weeks has an old LastSeen).
	FirstSeen, LastSeen time.Time
}

// Has says whether p has the feature f.
func (p Policy) Has(f string) bool {
	for _, x := range p.Features {
		if x == f {
			return true
		}
	}
	return false
}

// Config is the limiter configuration p records: Prefix, Capacity, Refill,
// Interval or Calendar (Location loaded by name), Storage, Grants, Ledger
// and Overrides (not Alerts' lines, which are not recorded). An error says
// the schedule is not one this release reads.
func (p Policy) Config() (pgratelimit.Config, error) {
	cfg := pgratelimit.Config{Prefix: p.Prefix, Capacity: p.Capacity, Refill: p.Refill,
		Grants: p.Has("grants"), Ledger: p.Has("ledger"), Overrides: p.Has("overrides")}
	if p.Storage == "ephemeral" {
		cfg.Storage = pgratelimit.Ephemeral
	}
	f := strings.Fields(p.Schedule)
	switch {
	case len(f) == 2 && f[0] == "every":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return cfg, fmt.Errorf("pgratelimit admin: policy of prefix %q: schedule %q: %w", p.Prefix, p.Schedule, err)
		}
		cfg.Interval = d
	case (len(f) == 3 || len(f) == 5 && f[3] == "anchor") && f[0] == "calendar":
		for _, e := range []pgratelimit.Period{pgratelimit.Day, pgratelimit.Week, pgratelimit.Month} {
			if e.String() == f[1] {
				cfg.Calendar.Every = e
			}
		}
		loc, err := time.LoadLocation(f[2])
		if err != nil || cfg.Calendar.Every == 0 {
			return cfg, fmt.Errorf("pgratelimit admin: policy of prefix %q: schedule %q is not one this release reads", p.Prefix, p.Schedule)
		}
		cfg.Calendar.Location = loc
		if len(f) == 5 {
			if cfg.Calendar.Anchor, err = time.Parse(time.RFC3339Nano, f[4]); err != nil {
				return cfg, fmt.Errorf("pgratelimit admin: policy of prefix %q: schedule %q: %w", p.Prefix, p.Schedule, err)
			}
		}
	default:
		return cfg, fmt.Errorf("pgratelimit admin: policy of prefix %q: schedule %q is not one this release reads", p.Prefix, p.Schedule)
	}
	return cfg, nil
}

// Same says whether p and o are the same policy (of one prefix, seen at
// different times).
func (p Policy) Same(o Policy) bool {
	return p.Prefix == o.Prefix && p.Storage == o.Storage && p.Capacity == o.Capacity && p.Refill == o.Refill &&
		p.Schedule == o.Schedule && strings.Join(p.Features, ",") == strings.Join(o.Features, ",")
}

// Policies returns every policy recorded, by prefix, the most recently
// seen first. A prefix with two policies seen recently is a prefix whose
// instances disagree (or a prefix of several plans on purpose: see the
// README's plans). ErrNotMigrated: migration 00010 is not applied.
func Policies(ctx context.Context, pool *pgxpool.Pool) ([]Policy, error) {
	rows, err := pool.Query(ctx, sqlgen.Policies.List)
	if err != nil {
		return nil, engine.DBError("list the policies", err)
	}
	defer rows.Close()
	var out []Policy
	for rows.Next() {
		var p Policy
		var features string
		if err := rows.Scan(&p.Prefix, &p.Storage, &p.Capacity, &p.Refill, &p.Schedule, &features, &p.FirstSeen, &p.LastSeen); err != nil {
			return nil, engine.DBError("list the policies", err)
		}
		if features != "" {
			p.Features = strings.Split(features, ",")
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, engine.DBError("list the policies", err)
	}
	return out, nil
}

// OverrideFilter selects overrides.
type OverrideFilter struct {
	// Prefix and Key, when set, select the overrides of that prefix, of
	// that key.
	Prefix, Key string
	// Limit is the most returned: 1 to MaxOverrides; 0 means 100.
	Limit int
	// AfterKey pages: the overrides of keys after it (in byte order), with
	// Prefix set: pass the last key of a page for the next one.
	AfterKey string
}

// MaxOverrides is the largest OverrideFilter.Limit.
const MaxOverrides = 10000

// Override is a key's override, as stored.
type Override struct {
	Prefix, Key      string
	Capacity, Refill int64
	// Until is when it ends (zero: no end). An override past it applies
	// no more, though cleanup may not have deleted it yet.
	Until time.Time
	Note  string
	// UpdatedAt is when it was last set, by the setting transaction's
	// clock.
	UpdatedAt time.Time
}

// Overrides returns the overrides f selects, in (prefix, key) order, the
// ended ones too (see Override.Until). A Limit out of range, or AfterKey
// without Prefix, is pgratelimit.ErrInvalidArgument; ErrNotMigrated:
// migration 00010 is not applied.
func Overrides(ctx context.Context, pool *pgxpool.Pool, f OverrideFilter) ([]Override, error) {
	switch {
	case f.Limit < 0 || f.Limit > MaxOverrides:
		return nil, fmt.Errorf("%w: OverrideFilter.Limit %d is not in [0, %d]", pgratelimit.ErrInvalidArgument, f.Limit, MaxOverrides)
	case f.AfterKey != "" && f.Prefix == "":
		return nil, fmt.Errorf("%w: OverrideFilter.AfterKey pages the keys of one prefix: set Prefix", pgratelimit.ErrInvalidArgument)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	rows, err := pool.Query(ctx, sqlgen.Overrides.List, f.Prefix, f.Key, f.AfterKey, f.Limit)
	if err != nil {
		return nil, engine.DBError("list the overrides", err)
	}
	defer rows.Close()
	var out []Override
	for rows.Next() {
		var o Override
		var until *time.Time
		if err := rows.Scan(&o.Prefix, &o.Key, &o.Capacity, &o.Refill, &until, &o.Note, &o.UpdatedAt); err != nil {
			return nil, engine.DBError("list the overrides", err)
		}
		if until != nil {
			o.Until = *until
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, engine.DBError("list the overrides", err)
	}
	return out, nil
}
