package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// flags is a command's flag set (spf13/pflag) plus the options most
// commands share.
type flags struct {
	*pflag.FlagSet
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
	overrides   bool          // the limiter has Config.Overrides (the override commands)
	db          *pgxpool.Pool // the limiter's pool (limiter), for reads through package admin

	// timeout bounds the command's database work (see command.timeout);
	// connectTimeout each connection attempt, from connectFrom ("--connect-timeout"
	// or the URL's connect_timeout).
	timeout        time.Duration
	connectTimeout time.Duration
	connectFrom    string
	// grace lengthens the bound of the command's context past --timeout:
	// acquire --wait waits up to --timeout, then tries once more.
	grace time.Duration
	// target names the database server, for messages; connected is set
	// once a connection to it is made.
	target    string
	connected atomic.Bool
	// dbctx is the context that withTimeout made, which explain reads to
	// tell the command's timeout from other deadlines.
	dbctx context.Context
	// inputs name the library's errors of bad input by the flag or
	// argument that gave it (see input).
	inputs []input
	// unreachable is the error of the command's first database access
	// (the recorded policies' read, see limiter), when it failed to reach
	// the database.
	unreachable error
}

// input is a flag or argument of the command line, name, and the library's
// errors that say its value is out of range (ErrInvalidCost...).
type input struct {
	name string
	errs []error
}

// input notes that the library's errors errs are about name's value: fail
// reports them as usage errors that name it. The library checks the values;
// the command does not repeat its rules.
func (f *flags) input(name string, errs ...error) {
	f.inputs = append(f.inputs, input{name, errs})
}

// usageOf returns err as a usage error naming its input, if it is one of
// the library's errors noted by input; else err.
func (f *flags) usageOf(err error) error {
	for _, in := range f.inputs {
		for _, e := range in.errs {
			if errors.Is(err, e) {
				return clierr.UsageError{Msg: in.name + ": " + clierr.Text(err), Err: err}
			}
		}
	}
	return err
}

// defaultConnectTimeout is --connect-timeout's default: a server that
// accepts connections but never answers (a hung host, a wrong port behind a
// load balancer) would otherwise hang a command until Ctrl-C.
const defaultConnectTimeout = 5 * time.Second

// newFlags returns the flag set of the command called name, with the flags
// every command has: --database-url, --json, --timeout, --connect-timeout.
func newFlags(c *cli, name string) *flags {
	cmd, _ := lookupCommand(name)
	return newCommandFlags(c, cmd)
}

// newCommandFlags is newFlags for cmd (a subcommand, which the command
// table does not list).
func newCommandFlags(c *cli, cmd command) *flags {
	f := newFlagSet(c, cmd)
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

// newFlagSet returns cmd's flag set, with no flags yet.
func newFlagSet(c *cli, cmd command) *flags {
	f := &flags{FlagSet: pflag.NewFlagSet(cmd.name, pflag.ContinueOnError), cmd: cmd, c: c}
	// pflag would print its own error and the usage on every parse error;
	// parse reports them once, in the command's words, instead.
	f.SetOutput(io.Discard)
	f.Usage = func() {}
	return f
}

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

// errHelp is parse's error when the command line asks for help, which parse
// has printed.
var errHelp = errors.New("help requested")

// usagef is clierr.Usagef: a mistake in the command line, which fail prints
// with the command's usage line.
func usagef(format string, args ...any) error { return clierr.Usagef(format, args...) }

// parse parses flags and positional arguments, in any order ("--" ends the
// flags), and checks the number of positional arguments is between minArgs
// and maxArgs. --help (-h) prints the command's help and returns errHelp.
func (f *flags) parse(args []string, minArgs, maxArgs int) ([]string, error) {
	// --json also makes the errors of the command line JSON, those found
	// before pflag reaches it too.
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--json" || a == "-json" || a == "--json=true" {
			f.json = f.Lookup("json") != nil
		}
	}
	if err := f.Parse(f.prepareArgs(args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			f.printHelp(f.c.stdout)
			return nil, errHelp
		}
		return nil, f.flagError(err)
	}
	pos := f.Args()
	for i, a := range pos {
		pos[i] = strings.TrimPrefix(a, positionalMark)
	}
	if len(pos) < minArgs || len(pos) > maxArgs {
		return nil, f.argCountError(pos, minArgs, maxArgs)
	}
	return pos, nil
}

// positionalMark marks, for pflag, an argument that starts with "-" but is
// positional. argv cannot hold a NUL byte, so no argument starts with one.
const positionalMark = "\x00"

// prepareArgs adapts args to pflag, which reads "-abc" as the short flags
// a, b and c; this CLI has none but -h. Before "--":
//   - a negative number that is not a flag's value ("refund KEY -5") is
//     marked positional, so that the command says what is wrong with N
//     rather than that there is no flag -5;
//   - "-name" and "-name=value" are "--name" and "--name=value", as Go's
//     flag package, with which this CLI began, reads them.
func (f *flags) prepareArgs(args []string) []string {
	out := make([]string, 0, len(args))
	takesValue := false // the argument before was a flag that takes the next as its value
	for i, a := range args {
		switch {
		case takesValue:
			takesValue = false
		case a == "--":
			return append(out, args[i:]...)
		case len(a) > 1 && a[0] == '-' && a[1] >= '0' && a[1] <= '9':
			a = positionalMark + a
		case len(a) > 2 && a[0] == '-' && a[1] != '-':
			a = "-" + a
			fallthrough
		case strings.HasPrefix(a, "--") && !strings.Contains(a, "="):
			fl := f.Lookup(strings.TrimPrefix(a, "--"))
			takesValue = fl != nil && fl.NoOptDefVal == ""
		}
		out = append(out, a)
	}
	return out
}

// flagError says what pflag found wrong, in the command's terms, from its
// typed errors.
func (f *flags) flagError(err error) error {
	var notExist *pflag.NotExistError
	var noValue *pflag.ValueRequiredError
	var badValue *pflag.InvalidValueError
	var badSyntax *pflag.InvalidSyntaxError
	switch {
	case errors.As(err, &notExist) && notExist.GetSpecifiedShortnames() != "":
		return usagef("unknown flag -%s", notExist.GetSpecifiedShortnames())
	case errors.As(err, &notExist):
		return usagef("unknown flag --%s", notExist.GetSpecifiedName())
	case errors.As(err, &noValue):
		return usagef("--%s needs a value", noValue.GetFlag().Name)
	case errors.As(err, &badValue):
		fl, v := badValue.GetFlag(), badValue.GetValue()
		if _, perr := strconv.ParseInt(v, 0, 64); valueKind(fl) == wholeNumber && errors.Is(perr, strconv.ErrRange) {
			return usagef("--%s %s is out of range", fl.Name, v)
		}
		return usagef("--%s wants %s, got %q", fl.Name, valueKind(fl), v)
	case errors.As(err, &badSyntax):
		return usagef("%q is not a flag (flags look like --name or --name=value)", badSyntax.GetSpecifiedFlag())
	}
	return usagef("%s", err)
}

// wholeNumber is valueKind's word for the integer flags.
const wholeNumber = "a whole number"

// valueKind says what kind of value a flag takes, for messages.
func valueKind(fl *pflag.Flag) string {
	switch fl.Value.Type() {
	case "int", "int64":
		return wholeNumber
	case "duration":
		return "a duration such as 500ms, 10s or 1h"
	case "bool":
		return "true or false"
	}
	return "a valid value"
}

// argCountError says which positional arguments are missing, or that there
// are too many.
func (f *flags) argCountError(pos []string, minArgs, maxArgs int) error {
	// The positional arguments' names, as in "KEY N": not flags, nor the
	// values of flags ("[--cost N]", "--ttl D").
	var names []string
	words := strings.Fields(f.cmd.args)
	for i, w := range words {
		if !strings.HasPrefix(w, "-") && !strings.HasPrefix(w, "[") && (i == 0 || !strings.HasPrefix(strings.TrimPrefix(words[i-1], "["), "-")) {
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
		quoted := make([]string, len(pos))
		for i, s := range pos {
			quoted[i] = strconv.Quote(s)
		}
		return usagef("too many arguments: %s takes %d (%s), got %d: %s", f.cmd.name, maxArgs, f.cmd.args, len(pos), strings.Join(quoted, " "))
	}
}

// printHelp prints the command's usage line, summary and flags to w.
func (f *flags) printHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: pgratelimit %s %s\n\n%s.\n\nflags:\n", f.cmd.name, f.cmd.args, f.cmd.summary)
	f.VisitAll(func(fl *pflag.Flag) {
		name, use := pflag.UnquoteUsage(fl)
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
		switch {
		case fl.Value.Type() == "string":
			if fl.DefValue != "" {
				def = fmt.Sprintf(" (default %q)", fl.DefValue)
			}
		case fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s":
			def = fmt.Sprintf(" (default %s)", fl.DefValue)
		}
		fmt.Fprintf(w, "%-24s %s%s\n", head, use, def)
	})
	if f.cmd.more != "" {
		fmt.Fprint(w, "\n"+f.cmd.more)
	}
}

// fail reports err on stderr, in the user's terms (a usage error with the
// command's usage line and where to get help; with --json, the JSON object
// errorJSON), and returns the exit status for it.
func (f *flags) fail(err error) int {
	if errors.Is(err, errHelp) {
		return exitOK
	}
	err = f.usageOf(err)
	msg := f.explain(err)
	if f.json {
		_ = json.NewEncoder(f.c.stderr).Encode(errorJSON{Error: msg, Code: f.errorCode(err)})
		return exitError
	}
	fmt.Fprintf(f.c.stderr, "pgratelimit %s: %s\n", f.Name(), msg)
	var ue clierr.UsageError
	if errors.As(err, &ue) {
		fmt.Fprintf(f.c.stderr, "usage: pgratelimit %s %s\nRun 'pgratelimit %s --help' for its flags.\n", f.cmd.name, f.cmd.args, f.cmd.name)
	}
	return exitError
}

// errorJSON is an error with --json, on stderr: its message (the line the
// text output prints after the command's name) and a code that says what
// kind it is (errorCodes; "usage" for a mistake in the command line,
// "error" for any other).
type errorJSON struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// errorCodes are the codes of errorJSON for the library's errors, the
// first that an error is wins.
var errorCodes = []struct {
	err  error
	code string
}{
	{pgratelimit.ErrNotMigrated, "not_migrated"},
	{pgratelimit.ErrInvalidConfig, "invalid_config"},
	{pgratelimit.ErrInvalidKey, "invalid_key"},
	{pgratelimit.ErrInvalidCost, "invalid_cost"},
	{pgratelimit.ErrCostExceedsCapacity, "cost_exceeds_capacity"},
	{pgratelimit.ErrInvalidRequestID, "invalid_request_id"},
	{pgratelimit.ErrInvalidArgument, "invalid_argument"}, // after the precise ones it covers
	{pgratelimit.ErrRequestMismatch, "request_mismatch"},
	{pgratelimit.ErrUnknownRequest, "unknown_request"},
	{pgratelimit.ErrGrantExpired, "grant_expired"},
	{pgratelimit.ErrLockTimeout, "lock_timeout"},
	{migrations.ErrNoCitus, "no_citus"},
}

// errorCode is err's code for errorJSON: the library's error it is, else
// usage, timeout (--timeout), connect, interrupted or error.
func (f *flags) errorCode(err error) string {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	var ue clierr.UsageError
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ue):
		return "usage"
	case f.timedOut():
		return "timeout"
	case errors.As(err, &ce):
		return "connect"
	case errors.Is(err, context.Canceled):
		return "interrupted"
	}
	return "error"
}
