package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// usageError is a mistake in the command line or the environment, which
// the harness prints with its usage line and exits 2 for.
type usageError struct{ Msg string }

func (e usageError) Error() string { return e.Msg }

func usagef(format string, args ...any) error {
	return usageError{Msg: fmt.Sprintf(format, args...)}
}

// oursReport is the line `pgratelimit bench --json` prints, as far as the
// harness reads it (the CLI's internal/bench.Report writes it): the fields
// every contender's line has, and pgratelimit's own beyond them.
type oursReport struct {
	Contender    string  `json:"contender"`
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Allowed      int64   `json:"allowed"`
	Denied       int64   `json:"denied"`
	Errors       int64   `json:"errors"`
	Audit        string  `json:"audit"`
	HotRatio     float64 `json:"hot_update_ratio"`
	Updates      int64   `json:"updates"`
	Leases       bool    `json:"leases"`
	LeaseMax     int64   `json:"lease_max,omitempty"`
	Pairs        int64   `json:"pairs,omitempty"`
	PairsPerSec  float64 `json:"pairs_per_sec,omitempty"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is main's body: it parses args and the environment, runs the
// harness and returns the exit status: 0 done, 2 bad usage, a contender
// that failed in every run of a scenario, or an interruption.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: peers [flags] %s\n\nflags:\n", Args)
		fs.PrintDefaults()
		fmt.Fprint(stderr, "\n"+Help())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := o.FromEnv(getenv); err != nil {
		return fail(stderr, err)
	}
	o.Stdout, o.Stderr = stdout, stderr
	if err := Run(ctx, o, fs.Args()); err != nil {
		return fail(stderr, err)
	}
	return 0
}

func fail(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "peers: %s\n", err)
	if errors.As(err, new(usageError)) {
		fmt.Fprintf(stderr, "usage: peers [flags] %s ('peers --help' for more)\n", Args)
	}
	return 2
}
