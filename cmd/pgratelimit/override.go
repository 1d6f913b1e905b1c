package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
)

// Limits as data in the CLI: the policies the application's limiters
// recorded (pgratelimit_policies), used when no policy flag is given, and
// `pgratelimit override set|list|clear`. See docs/overrides.md.

// policyFlags are the flags that give a limiter's policy: given any, the
// command uses the flags, else the prefix's recorded policy.
var policyFlags = []string{"capacity", "refill", "interval", "every", "tz", "anchor", "storage"}

// storedPolicy returns the configuration a command on cfg's prefix runs
// with: cfg (the flags') when a policy flag is given, else the policy the
// prefix's limiters recorded last (Grants and Ledger as the CLI has them:
// with durable storage; Overrides as the application's, and for the
// override commands). It
// warns on stderr when the flags differ from every recorded policy, and
// when the prefix has several. A database without recorded policies (or
// without migration 00010) changes nothing.
func (f *flags) storedPolicy(ctx context.Context, pool *pgxpool.Pool, cfg pgratelimit.Config) (pgratelimit.Config, error) {
	if !f.hasPolicy {
		return cfg, nil
	}
	all, err := admin.Policies(ctx, pool)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return cfg, nil // the database answered: no policies to read
	case err != nil:
		return cfg, err
	}
	var ps []admin.Policy
	for _, p := range all {
		if p.Prefix == cfg.Prefix {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return cfg, nil
	}
	flagged := false
	for _, name := range policyFlags {
		flagged = flagged || f.Changed(name)
	}
	if len(ps) > 1 {
		var list []string
		for _, p := range ps {
			list = append(list, describePolicy(p)+" (last seen "+p.LastSeen.UTC().Format(time.RFC3339)+")")
		}
		use := "using the most recently seen"
		if flagged {
			use = "using your flags"
		}
		f.warn("prefix %q has %d recorded policies (instances that disagree, or plans on purpose): %s; %s", cfg.Prefix, len(ps), strings.Join(list, "; "), use)
	}
	if flagged {
		mine := describeConfig(cfg)
		for _, p := range ps {
			if describePolicy(p) == mine {
				return cfg, nil
			}
		}
		f.warn("your flags say %s, but prefix %q's limiters run %s (recorded %s): the key is shown under your flags", mine, cfg.Prefix, describePolicy(ps[0]), ps[0].LastSeen.UTC().Format(time.RFC3339))
		return cfg, nil
	}
	stored, err := ps[0].Config()
	if err != nil {
		f.warn("%v; using the flags' defaults", err)
		return cfg, nil
	}
	stored.Grants, stored.Ledger = stored.Storage == pgratelimit.Durable, stored.Storage == pgratelimit.Durable
	stored.Overrides = stored.Overrides || f.overrides
	f.capacity, f.refill, f.interval = stored.Capacity, stored.Refill, stored.Interval
	return stored, nil
}

// warn writes a warning on stderr.
func (f *flags) warn(format string, args ...any) {
	fmt.Fprintf(f.c.stderr, "pgratelimit %s: warning: %s\n", f.cmd.name, fmt.Sprintf(format, args...))
}

// describePolicy and describeConfig say a policy in the same words, so that
// a recorded one and the flags' compare.
func describePolicy(p admin.Policy) string {
	return fmt.Sprintf("capacity %d, refill %d %s, %s", p.Capacity, p.Refill, p.Schedule, p.Storage)
}

func describeConfig(cfg pgratelimit.Config) string {
	sched := "every " + cfg.Interval.String()
	if c := cfg.Calendar; c != (pgratelimit.Calendar{}) {
		sched = "calendar " + c.Every.String() + " " + c.Location.String()
		if !c.Anchor.IsZero() {
			sched += " anchor " + c.Anchor.UTC().Format(time.RFC3339Nano)
		}
	}
	return fmt.Sprintf("capacity %d, refill %d %s, %s", cfg.Capacity, cfg.Refill, sched, cfg.Storage)
}

// overrideMore ends override's help.
const overrideMore = `override set KEY --capacity N --refill N [--until T] [--note S] gives KEY its own capacity
and refill (T: an RFC 3339 time, a date, or a duration from now; default: no end); the key's
bucket changes plan at once (a bigger capacity adds the difference, a smaller one clamps).
override clear KEY takes it away. override list [--prefix P] [--key K] lists them. The
limiter's schedule and storage are the prefix's recorded policy unless --interval, --every
or --storage are given. Run 'pgratelimit override set --help' for a subcommand's flags.
`

// overrideCommands are override's subcommands.
var overrideCommands = map[string]command{
	"set": {name: "override set", args: "KEY --capacity N --refill N [--until T] [--note S]", timeout: 10 * time.Second,
		summary: "give KEY its own capacity and refill (an override), its bucket changing plan at once"},
	"clear": {name: "override clear", args: "KEY", timeout: 10 * time.Second,
		summary: "take KEY's override away: the limiter's policy applies again from its next check"},
	"list": {name: "override list", args: "[--prefix P] [--key K]", timeout: 10 * time.Second,
		summary: "list the overrides, by prefix and key"},
}

// runOverride is `pgratelimit override set|list|clear`.
func runOverride(ctx context.Context, c *cli, args []string) int {
	var sub command
	ok := len(args) > 0
	if ok {
		sub, ok = overrideCommands[args[0]]
	}
	if !ok {
		f := newFlags(c, "override")
		if _, err := f.parse(args, 0, 0); err != nil && len(args) == 0 || err != nil && strings.HasPrefix(args[0], "-") {
			return f.fail(err)
		}
		what := "missing action:"
		if len(args) > 0 {
			what = fmt.Sprintf("unknown action %q:", args[0])
		}
		return f.fail(usagef("%s want set, list or clear", what))
	}
	f := newCommandFlags(c, sub)
	switch args[0] {
	case "set":
		return runOverrideSet(ctx, f, args[1:])
	case "clear":
		return runOverrideClear(ctx, f, args[1:])
	}
	return runOverrideList(ctx, f, args[1:])
}

// overrideJSON is an override (list), or the one set or cleared with the
// key's bucket afterwards (set, clear: Result's fields).
type overrideJSON struct {
	Prefix    string      `json:"prefix"`
	Key       string      `json:"key"`
	Cleared   bool        `json:"cleared,omitempty"`
	Capacity  int64       `json:"capacity,omitempty"`
	Refill    int64       `json:"refill,omitempty"`
	Until     *time.Time  `json:"until,omitempty"`
	Note      string      `json:"note,omitempty"`
	UpdatedAt *time.Time  `json:"updated_at,omitempty"`
	Bucket    *resultJSON `json:"bucket,omitempty"`
}

func untilText(t time.Time) string {
	if t.IsZero() {
		return "no end"
	}
	return "until " + t.UTC().Format(time.RFC3339)
}

func runOverrideSet(ctx context.Context, f *flags, args []string) int {
	f.withPolicy()
	f.overrides = true
	f.Lookup("capacity").Usage = "the override's capacity: the most tokens the key's bucket holds (Override.Capacity; required)"
	f.Lookup("refill").Usage = "the override's refill: tokens added every interval (Override.Refill; required)"
	until := f.String("until", "", "when the override ends: an RFC 3339 time, a date, or a duration from now such as 720h (default: no end)")
	note := f.String("note", "", "why, for operators (Override.Note)")
	var o pgratelimit.Override
	check := func([]string) error {
		if !f.Changed("capacity") || !f.Changed("refill") {
			return usagef("--capacity and --refill are the override's: give both")
		}
		o = pgratelimit.Override{Capacity: f.capacity, Refill: f.refill, Note: *note}
		t, err := parseExpiry(*until, time.Now())
		if err != nil {
			return usagef("--until must be an RFC 3339 time, a date or a positive duration, got %q", *until)
		}
		o.Until = t
		// The limiter's own policy is the prefix's recorded one (or the
		// defaults): --capacity and --refill are the override's.
		for _, name := range []string{"capacity", "refill"} {
			fl := f.Lookup(name)
			fl.Changed = false
			_ = fl.Value.Set(fl.DefValue)
		}
		return nil
	}
	f.input("--capacity, --refill, --until or --note", pgratelimit.ErrInvalidArgument)
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.SetOverride(ctx, key, o)
		if err != nil {
			return 0, err
		}
		if f.json {
			j := overrideJSON{Prefix: l.Config().Prefix, Key: key, Capacity: o.Capacity, Refill: o.Refill, Note: o.Note, Bucket: ptr(newResultJSON(key, r))}
			if !o.Until.IsZero() {
				j.Until = ptr(o.Until.UTC())
			}
			f.printJSON(j)
		} else {
			fmt.Fprintf(f.c.stdout, "override set on %q of prefix %q: capacity %d, refill %d, %s: it has %s\n",
				key, l.Config().Prefix, o.Capacity, o.Refill, untilText(o.Until), holding(r))
		}
		return exitOK, nil
	})
}

func runOverrideClear(ctx context.Context, f *flags, args []string) int {
	f.withPolicy()
	f.overrides = true
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.ClearOverride(ctx, key)
		if err != nil {
			return 0, err
		}
		f.emit(overrideJSON{Prefix: l.Config().Prefix, Key: key, Cleared: true, Bucket: ptr(newResultJSON(key, r))},
			fmt.Sprintf("override cleared on %q of prefix %q (if it had one): under the limiter's policy from its next check, it has %s", key, l.Config().Prefix, holding(r)))
		return exitOK, nil
	})
}

func runOverrideList(ctx context.Context, f *flags, args []string) int {
	var filter admin.OverrideFilter
	f.StringVar(&filter.Prefix, "prefix", "", "only the overrides of limiter prefix `P` (default: any)")
	f.StringVar(&filter.Key, "key", "", "only the overrides of key `K` (default: any)")
	f.IntVar(&filter.Limit, "limit", 100, fmt.Sprintf("list at most N (at most %d)", admin.MaxOverrides))
	f.StringVar(&filter.AfterKey, "after", "", "with --prefix: the keys after `K` (the last of the page before)")
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	f.input("--limit or --after", pgratelimit.ErrInvalidArgument)
	pool, err := f.pool(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer pool.Close()
	qctx, cancel := f.withTimeout(ctx)
	defer cancel()
	os, err := admin.Overrides(qctx, pool, filter)
	if err != nil {
		return f.fail(err)
	}
	now := time.Now()
	for _, o := range os {
		if f.json {
			j := overrideJSON{Prefix: o.Prefix, Key: o.Key, Capacity: o.Capacity, Refill: o.Refill, Note: o.Note, UpdatedAt: ptr(o.UpdatedAt.UTC())}
			if !o.Until.IsZero() {
				j.Until = ptr(o.Until.UTC())
			}
			f.printJSON(j)
			continue
		}
		end := untilText(o.Until)
		if !o.Until.IsZero() && !now.Before(o.Until) {
			end = "ended " + o.Until.UTC().Format(time.RFC3339)
		}
		line := fmt.Sprintf("%-16s %-24q capacity %d, refill %d, %s, set %s", o.Prefix, o.Key, o.Capacity, o.Refill, end, o.UpdatedAt.UTC().Format(time.RFC3339))
		if o.Note != "" {
			line += ": " + o.Note
		}
		fmt.Fprintln(f.c.stdout, line)
	}
	if len(os) == 0 && !f.json {
		fmt.Fprintln(f.c.stderr, "no overrides")
	}
	return exitOK
}

func ptr[T any](v T) *T { return &v }
