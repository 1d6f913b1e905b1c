// Command pgratelimit operates pgratelimit's buckets and leases: apply the
// migrations, check, peek at, refund and reset keys, take, extend, release
// and list concurrency leases, list and follow usage alerts, clean up
// expired rows, start a throwaway PostgreSQL to try them on, run a demo and
// a load benchmark.
//
// Run "pgratelimit help" for the commands, and "pgratelimit COMMAND --help"
// for each one's flags. Exit status: 0 allowed or done, 1 denied, 2 bad usage
// or an error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// The exit statuses: done (or allowed), denied, and bad usage or an error.
const (
	exitOK     = 0
	exitDenied = 1
	exitError  = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// cli is one invocation: its streams and environment. terminal says stdin
// is a terminal, where a person can answer a question (migrate down asks
// one).
type cli struct {
	stdin          io.Reader
	terminal       bool
	stdout, stderr io.Writer
	getenv         func(string) string
}

// command is one of the CLI's commands: its name, its arguments and summary
// for the usage, and the function that runs it, which returns the exit
// status. The command's own code lives beside main.go: keys.go (allow, peek,
// refund, reset, grant, balance, settle, ledger), leases.go (acquire,
// release, extend, leases), events.go (events),
// migrate.go (migrate, cleanup), throwaway.go (db), demo.go and bench.go
// (wiring for packages demo and bench), version.go (version).
type command struct {
	name, args, summary string
	run                 func(ctx context.Context, c *cli, args []string) int
	// timeout is the command's default --timeout, and timeoutUse its help
	// text when the command's database work is not one piece.
	timeout    time.Duration
	timeoutUse string
	// more is told after the flags in the command's help, if not empty.
	more string
}

// commands lists the commands, in the order usage shows them.
func commands() []command {
	return []command{
		{"migrate", "up|down|status|distribute", "apply, roll back (one step) or list the schema migrations; distribute the tables by key on Citus (after up)", runMigrate, 5 * time.Minute, "", ""},
		{"allow", "KEY [--cost N]", "check KEY and take its cost if allowed (exit 1 when denied; --request-id ID: once per ID)", runAllow, 10 * time.Second, "", ""},
		{"peek", "KEY", "show KEY's bucket without taking anything", runPeek, 10 * time.Second, "", ""},
		{"refund", "KEY N", "give N tokens back to KEY's bucket", runRefund, 10 * time.Second, "", ""},
		{"grant", "KEY N [--expires T]", "grant KEY N credits beyond its bucket, spent after it (until T; --request-id ID: once per ID)", runGrant, 10 * time.Second, "", ""},
		{"balance", "KEY", "show KEY's bucket and each of its live grants", runBalance, 10 * time.Second, "", ""},
		{"settle", "KEY --request-id ID --actual N", "bring the charge of request ID to its actual cost N", runSettle, 10 * time.Second, "", ""},
		{"ledger", "KEY [--since T]", "list KEY's ledger: charges, debits, refunds, grants, settlements, resets, grant expiries and plan changes", runLedger, 10 * time.Second, "", ""},
		{"reset", "KEY", "make KEY's bucket full again", runReset, 10 * time.Second, "", ""},
		{"acquire", "KEY --max N --ttl D", "take a lease of KEY's units and print it, its ID first (exit 1 when none is free; --wait: wait for one)", runAcquire, 10 * time.Second,
			"give up on the command's database work, and with --wait on waiting for free units, after D; 0: never", leasesMore},
		{"release", "KEY LEASE-ID", "give a lease's units back (one not held is done; exit 1 when it had expired)", runRelease, 10 * time.Second, "", leasesMore},
		{"extend", "KEY LEASE-ID --ttl D", "renew a lease for D from now: a long holder's heartbeat (exit 1 when it expired or is not held)", runExtend, 10 * time.Second, "", leasesMore},
		{"leases", "KEY [--max N]", "list KEY's live leases, oldest first", runLeases, 10 * time.Second, "", ""},
		{"events", "[--key K] [--follow]", "list the usage alerts (Config.Alerts), newest last; --follow waits for more until Ctrl-C", runEvents, 10 * time.Second,
			"give up on each read of the events (each poll, with --follow) after D; 0: never", eventsMore},
		{"cleanup", "[--every D]", "delete dead rows (full buckets, spent grants, expired leases, old request IDs...), once or every D", runCleanup, 5 * time.Minute,
			"give up on a cleanup run (each run, with --every) after D; 0: never", ""},
		{"db", "[--port N]", "start a throwaway PostgreSQL, migrated; print its DATABASE_URL and keep it until Ctrl-C", runDB, 2 * time.Minute,
			"give up on starting the server and applying the migrations after D; 0: never", dbMore},
		{"demo", "[--addr A] [--once]", "serve a rate-limited HTTP app and a page to try it on", runDemo, 10 * time.Second,
			"give up on the database work of the set-up and of each request after D; 0: never", ""},
		{"override", "set|list|clear [KEY]", "give a key its own capacity and refill, list the overrides, or take one away (docs/overrides.md)", runOverride, 10 * time.Second, "", overrideMore},
		{"version", "", "print the CLI's module version and the VCS revision it was built from", runVersion, 0, "", ""},
		{"bench", "[flags]", "measure checks per second under load (--leases: acquire+release pairs of leases)", runBench, time.Minute,
			"give up on setting up and removing the scratch schema after D (the run itself lasts --duration); 0: never", benchMore},
	}
}

// lookupCommand returns the command called name.
func lookupCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// usage writes the CLI's usage: the commands and what they share.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: pgratelimit COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %-22s %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintln(w, "\nThe database comes from --database-url or $DATABASE_URL. Every command gives up")
	fmt.Fprintf(w, "connecting after --connect-timeout (default %s) and its database work after\n", defaultConnectTimeout)
	fmt.Fprintln(w, "--timeout (default 10s for the commands on keys and for events; 0: never).")
	fmt.Fprintln(w, "Run 'pgratelimit COMMAND --help' for its flags.")
	fmt.Fprintln(w, "Exit status: 0 allowed or done, 1 denied, 2 bad usage or error.")
}

// run runs the command args name and returns its exit status: main's body,
// with the streams and environment as arguments for the tests.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	st, err := os.Stdin.Stat()
	terminal := err == nil && st.Mode()&os.ModeCharDevice != 0
	return runCLI(ctx, &cli{stdin: os.Stdin, terminal: terminal, stdout: stdout, stderr: stderr, getenv: getenv}, args)
}

// runCLI runs the command args name in c and returns its exit status.
func runCLI(ctx context.Context, c *cli, args []string) int {
	stdout, stderr := c.stdout, c.stderr
	if len(args) == 0 {
		usage(stderr)
		return exitError
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) >= 2 && args[0] == "help" { // help COMMAND
			return runCLI(ctx, c, append(args[1:len(args):len(args)], "--help"))
		}
		usage(stdout)
		return exitOK
	}
	if cmd, ok := lookupCommand(args[0]); ok {
		return cmd.run(ctx, c, args[1:])
	}
	fmt.Fprintf(stderr, "pgratelimit: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitError
}
