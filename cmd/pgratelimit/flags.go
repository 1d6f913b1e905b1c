package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// flags is a subcommand's flag set plus the options most share.
type flags struct {
	*flag.FlagSet
	cmd         command
	c           *cli
	databaseURL string
	json        bool
	hasPolicy   bool
	prefix      string
	capacity    int64
	refill      int64
	interval    time.Duration
	storage     string
	every       string // a calendar period, or "" for --interval
	tz          string
	anchor      string

	// timeout bounds the command's database work (see command.timeout);
	// connectTimeout each connection attempt, from connectFrom ("--connect-timeout"
	// or the URL's connect_timeout).
	timeout        time.Duration
	connectTimeout time.Duration
	connectFrom    string
	// target names the database server, for messages; connected is set
	// once a connection to it is made.
	target    string
	connected atomic.Bool
	// dbctx is the context that withTimeout made, which fail reads to tell
	// the command's timeout from other deadlines.
	dbctx context.Context
}

// defaultConnectTimeout is --connect-timeout's default: a server that
// accepts connections but never answers (a hung host, a wrong port behind a
// load balancer) would otherwise hang a command until Ctrl-C.
const defaultConnectTimeout = 5 * time.Second

// errTimedOut is the cause of a command's context that passed its --timeout.
var errTimedOut = errors.New("--timeout passed")

func newFlags(c *cli, name string) *flags {
	var cmd command
	for _, x := range commands {
		if x.name == name {
			cmd = x
		}
	}
	f := &flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), cmd: cmd, c: c}
	// The flag package would print its own error and the usage on every
	// parse error; parse reports them once, in its own words, instead.
	f.SetOutput(io.Discard)
	f.Usage = func() {}
	f.StringVar(&f.databaseURL, "database-url", "", "PostgreSQL `URL` (default $DATABASE_URL)")
	f.BoolVar(&f.json, "json", false, "print JSON instead of text")
	use := cmd.timeoutUse
	if use == "" {
		use = "give up on the command's database work after D; 0: never"
	}
	f.DurationVar(&f.timeout, "timeout", cmd.timeout, use)
	f.DurationVar(&f.connectTimeout, "connect-timeout", defaultConnectTimeout,
		"give up connecting to the database after D (a connect_timeout in the URL replaces the default); 0: never")
	f.connectFrom = "--connect-timeout"
	return f
}

// withTimeout returns ctx bounded by --timeout, for the command's database
// work.
func (f *flags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.timeout <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, f.timeout, errTimedOut)
	f.dbctx = ctx
	return ctx, cancel
}

// prepare gives cc the connect timeout (--connect-timeout when set on the
// command line, else the URL's connect_timeout if it has one, else the
// default) and notes where it connects to and when it has.
func (f *flags) prepare(cc *pgconn.Config) {
	f.target = target(cc)
	after := cc.AfterConnect
	cc.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		f.connected.Store(true)
		if after != nil {
			return after(ctx, pc)
		}
		return nil
	}
	explicit := false
	f.Visit(func(fl *flag.Flag) { explicit = explicit || fl.Name == "connect-timeout" })
	if !explicit && cc.ConnectTimeout != 0 {
		f.connectTimeout, f.connectFrom = cc.ConnectTimeout, "connect_timeout in the URL"
		return
	}
	cc.ConnectTimeout = f.connectTimeout
}

// connConfig parses the database URL, with the connect timeout set.
func (f *flags) connConfig() (*pgx.ConnConfig, error) {
	u, err := f.url()
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	f.prepare(&cfg.Config)
	return cfg, nil
}

// poolConfig parses the database URL as a pool's, with the connect timeout
// set.
func (f *flags) poolConfig() (*pgxpool.Config, error) {
	u, err := f.url()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	f.prepare(&cfg.ConnConfig.Config)
	return cfg, nil
}

// grants says whether the command's limiter has grants: durable storage.
func (f *flags) grants() bool { return f.storage == "durable" }

// withPolicy adds the limiter policy flags.
func (f *flags) withPolicy() *flags {
	f.hasPolicy = true
	f.StringVar(&f.prefix, "prefix", "default", "the limiter's key namespace (Config.Prefix)")
	f.Int64Var(&f.capacity, "capacity", 10, "most tokens a bucket holds (Config.Capacity)")
	f.Int64Var(&f.refill, "refill", 1, "tokens added every interval (Config.Refill)")
	f.DurationVar(&f.interval, "interval", time.Second, "the refill period (Config.Interval)")
	f.StringVar(&f.every, "every", "", "refill on calendar boundaries instead of every --interval: day, week or month (Config.Calendar)")
	f.StringVar(&f.tz, "tz", "UTC", "the time zone of --every's boundaries (a tz database name such as Europe/Berlin)")
	f.StringVar(&f.anchor, "anchor", "", "the phase of --every's boundaries: a time (RFC 3339) or date whose time of day, weekday or day of the month they fall on (default: midnight, Mondays, the 1st)")
	f.StringVar(&f.storage, "storage", "durable", "durable or ephemeral")
	return f
}

// calendar reads --every, --tz and --anchor.
func (f *flags) calendar() (pgratelimit.Calendar, error) {
	var c pgratelimit.Calendar
	switch f.every {
	case "day":
		c.Every = pgratelimit.Day
	case "week":
		c.Every = pgratelimit.Week
	case "month":
		c.Every = pgratelimit.Month
	default:
		return c, usagef("--every must be day, week or month, got %q", f.every)
	}
	loc, err := time.LoadLocation(f.tz)
	if err != nil {
		return c, usagef("--tz: no time zone %q in this system's tz database", f.tz)
	}
	c.Location = loc
	if f.anchor != "" {
		a, err := time.ParseInLocation(time.RFC3339Nano, f.anchor, loc)
		if err != nil {
			if a, err = time.ParseInLocation(time.DateOnly, f.anchor, loc); err != nil {
				return c, usagef("--anchor must be an RFC 3339 time or a date (2026-01-17), got %q", f.anchor)
			}
		}
		c.Anchor = a
	}
	return c, nil
}

// printHelp prints the command's usage line, summary and flags to w.
func (f *flags) printHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: pgratelimit %s %s\n\n%s.\n\nflags:\n", f.cmd.name, f.cmd.args, f.cmd.summary)
	f.VisitAll(func(fl *flag.Flag) {
		name, use := flag.UnquoteUsage(fl)
		switch name {
		case "int", "uint", "float":
			name = "N"
		case "duration":
			name = "D"
		case "string":
			name = "VALUE"
		}
		head := "  --" + fl.Name
		if name != "" {
			head += " " + name
		}
		def := ""
		switch fl.Value.(flag.Getter).Get().(type) {
		case string:
			if fl.DefValue != "" {
				def = fmt.Sprintf(" (default %q)", fl.DefValue)
			}
		default:
			if fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s" {
				def = fmt.Sprintf(" (default %s)", fl.DefValue)
			}
		}
		fmt.Fprintf(w, "%-24s %s%s\n", head, use, def)
	})
}

var errHelp = errors.New("help requested")

// usageError is a mistake in the command line: fail prints it with the
// command's usage line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// negativeNumber matches an argument such as "-5": a positional argument
// (a refund amount, say), never a flag.
var negativeNumber = regexp.MustCompile(`^-[0-9]`)

// parse parses flags and positional arguments in any order, and checks the
// number of positional arguments is between minArgs and maxArgs.
func (f *flags) parse(args []string, minArgs, maxArgs int) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		a := args[0]
		if a == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		if a == "-" || !strings.HasPrefix(a, "-") || negativeNumber.MatchString(a) {
			pos = append(pos, a)
			args = args[1:]
			continue
		}
		// A flag, with the next argument as its value when it takes one and
		// has no "=value".
		n := 1
		name := strings.TrimLeft(a, "-")
		if !strings.Contains(name, "=") && len(args) > 1 {
			if fl := f.Lookup(name); fl != nil && !isBoolFlag(fl) {
				n = 2
			}
		}
		if err := f.Parse(args[:n]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.printHelp(f.c.stdout)
				return nil, errHelp
			}
			return nil, f.flagError(err)
		}
		args = args[n:]
	}
	if len(pos) < minArgs || len(pos) > maxArgs {
		return nil, f.argCountError(pos, minArgs, maxArgs)
	}
	return pos, nil
}

func isBoolFlag(fl *flag.Flag) bool {
	b, ok := fl.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (f *flags) argCountError(pos []string, minArgs, maxArgs int) error {
	// The positional arguments' names, as in "KEY N": not flags, nor the
	// values of flags ("[--cost N]").
	var names []string
	words := strings.Fields(f.cmd.args)
	for i, w := range words {
		if !strings.HasPrefix(w, "-") && !strings.HasPrefix(w, "[") && (i == 0 || !strings.HasPrefix(words[i-1], "[-")) {
			names = append(names, w)
		}
	}
	switch {
	case maxArgs == 0:
		return usagef("unexpected argument %q: %s takes only flags", pos[0], f.cmd.name)
	case len(pos) < minArgs && len(names) > len(pos):
		return usagef("missing %s", strings.Join(names[len(pos):], " and "))
	case len(pos) < minArgs:
		return usagef("missing argument: want %s", f.cmd.args)
	default:
		return usagef("too many arguments: %s takes %d (%s), got %d: %s", f.cmd.name, maxArgs, f.cmd.args, len(pos), strings.Join(quoteAll(pos), " "))
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

var (
	reUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	reNeedsArg  = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	reBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for flag -+([^:]*): (.*)$`)
	reBadSyntax = regexp.MustCompile(`^bad flag syntax: (.*)$`)
)

// flagError rewords the flag package's errors in the command's terms.
func (f *flags) flagError(err error) error {
	msg := err.Error()
	if m := reUndefined.FindStringSubmatch(msg); m != nil {
		return usagef("unknown flag --%s", m[1])
	}
	if m := reNeedsArg.FindStringSubmatch(msg); m != nil {
		return usagef("--%s needs a value", m[1])
	}
	if m := reBadValue.FindStringSubmatch(msg); m != nil {
		what := "a valid value"
		if fl := f.Lookup(m[2]); fl != nil {
			switch fl.Value.(flag.Getter).Get().(type) {
			case int, int64:
				what = "a whole number"
			case time.Duration:
				what = "a duration such as 500ms, 10s or 1h"
			case bool:
				what = "true or false"
			}
		}
		if strings.Contains(m[3], "out of range") {
			return usagef("--%s %s is out of range", m[2], m[1])
		}
		return usagef("--%s wants %s, got %q", m[2], what, m[1])
	}
	if m := reBadSyntax.FindStringSubmatch(msg); m != nil {
		return usagef("%q is not a flag (flags look like --name or --name=value)", m[1])
	}
	return usageError{msg}
}

// fail reports err on stderr, in the user's terms, and returns the exit
// status for it.
func (f *flags) fail(err error) int {
	if errors.Is(err, errHelp) {
		return exitOK
	}
	fmt.Fprintf(f.c.stderr, "pgratelimit %s: %s\n", f.Name(), f.explain(err))
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(f.c.stderr, "usage: pgratelimit %s %s\nRun 'pgratelimit %s --help' for its flags.\n", f.cmd.name, f.cmd.args, f.cmd.name)
	}
	return exitError
}

func (f *flags) url() (string, error) {
	u := f.databaseURL
	if u == "" {
		u = f.c.getenv("DATABASE_URL")
	}
	if u == "" {
		return "", errors.New("no database: set --database-url or DATABASE_URL")
	}
	return u, nil
}

func (f *flags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := f.poolConfig()
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// config is the limiter Config of the policy flags, checked in their terms
// (the library would name Config fields instead).
func (f *flags) config() (pgratelimit.Config, error) {
	cfg := pgratelimit.Config{Prefix: f.prefix, Capacity: f.capacity, Refill: f.refill, Interval: f.interval}
	switch f.storage {
	case "durable":
		cfg.Storage = pgratelimit.Durable
		// The CLI sees and spends grants as a limiter with Config.Grants does,
		// and records what it changes in the ledger.
		cfg.Grants, cfg.Ledger = true, true
	case "ephemeral":
		cfg.Storage = pgratelimit.Ephemeral
	default:
		return cfg, usagef("--storage must be durable or ephemeral, got %q", f.storage)
	}
	if !f.hasPolicy {
		return cfg, nil
	}
	switch {
	case f.prefix == "":
		return cfg, usagef("--prefix must not be empty")
	case f.capacity < 1:
		return cfg, usagef("--capacity must be at least 1, got %d", f.capacity)
	case f.refill < 1:
		return cfg, usagef("--refill must be at least 1, got %d", f.refill)
	case f.every != "":
		explicit := false
		f.Visit(func(fl *flag.Flag) { explicit = explicit || fl.Name == "interval" })
		if explicit {
			return cfg, usagef("--every and --interval do not go together: refills fall on the calendar or every interval")
		}
		cal, err := f.calendar()
		if err != nil {
			return cfg, err
		}
		cfg.Calendar, cfg.Interval = cal, 0
	case f.interval <= 0:
		return cfg, usagef("--interval must be positive, got %s", f.interval)
	case f.interval%time.Microsecond != 0:
		return cfg, usagef("--interval must be a whole number of microseconds, got %s", f.interval)
	}
	return cfg, nil
}

func (f *flags) limiter(ctx context.Context) (*pgratelimit.Limiter, func(), error) {
	cfg, err := f.config()
	if err != nil {
		return nil, nil, err
	}
	pool, err := f.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := pgratelimit.New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return l, pool.Close, nil
}

func (f *flags) printJSON(v any) {
	enc := json.NewEncoder(f.c.stdout)
	_ = enc.Encode(v)
}
