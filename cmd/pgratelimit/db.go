package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// explainf is err of the library told in the command's words (errors.Is
// still finds err, for --json's error code).
func explainf(err error, format string, args ...any) error {
	return clierr.Explained{Msg: fmt.Sprintf(format, args...), Err: err}
}

// errTimedOut is the cause of a command's context that passed its --timeout.
var errTimedOut = errors.New("--timeout passed")

// withTimeout returns ctx bounded by --timeout, for the command's database
// work.
func (f *flags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.timeout <= 0 {
		return ctx, func() {}
	}
	if f.timedOut() {
		return f.dbctx, func() {} // the command's --timeout has passed: what is left gives up too
	}
	ctx, cancel := context.WithTimeoutCause(ctx, f.timeout+f.grace, errTimedOut)
	f.dbctx = ctx
	return ctx, cancel
}

// timedOut says the command's --timeout has passed.
func (f *flags) timedOut() bool {
	return f.dbctx != nil && errors.Is(context.Cause(f.dbctx), errTimedOut)
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
	if !f.Changed("connect-timeout") && cc.ConnectTimeout != 0 {
		f.connectTimeout, f.connectFrom = cc.ConnectTimeout, "connect_timeout in the URL"
		return
	}
	cc.ConnectTimeout = f.connectTimeout
}

// url is --database-url, else $DATABASE_URL.
func (f *flags) url() (string, error) {
	u := f.databaseURL
	if u == "" {
		u = f.c.getenv("DATABASE_URL")
	}
	if u == "" {
		return "", usagef("no database: set --database-url or DATABASE_URL")
	}
	// A URL of another database (mysql://...) is said so, rather than as
	// whatever pgx makes of it. (pgx reads key=value strings too.)
	if scheme, _, ok := strings.Cut(u, "://"); ok && scheme != "postgres" && scheme != "postgresql" {
		return "", usagef("the database URL is a %s:// URL: pgratelimit needs PostgreSQL, a postgres:// (or postgresql://) URL such as postgres://user:password@localhost:5432/app", scheme)
	}
	return u, nil
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

func (f *flags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := f.poolConfig()
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// grants says whether the command's limiter has grants: durable storage.
func (f *flags) grants() bool { return f.storage == "durable" }

// config is the limiter Config of the policy flags. The library checks it
// (New); configError says what it found in the flags' terms.
func (f *flags) config() (pgratelimit.Config, error) {
	cfg := pgratelimit.Config{Prefix: f.prefix, Capacity: f.capacity, Refill: f.refill, Interval: f.interval}
	var err error
	if cfg.Storage, err = f.storageFlag(); err != nil {
		return cfg, err
	}
	// The CLI sees and spends grants as a limiter with Config.Grants does,
	// and records what it changes in the ledger (durable storage only).
	cfg.Grants, cfg.Ledger = f.grants(), f.grants()
	// The override commands' limiter reads overrides; the others' do when
	// the prefix's recorded policy does (storedPolicy).
	cfg.Overrides = f.overrides
	if !f.hasPolicy || f.every == "" {
		return cfg, nil
	}
	cal, err := f.calendar()
	if err != nil {
		return cfg, err
	}
	cfg.Calendar = cal
	if !f.Changed("interval") { // (both given: the library refuses them)
		cfg.Interval = 0
	}
	return cfg, nil
}

// storageFlag is --storage's Storage.
func (f *flags) storageFlag() (pgratelimit.Storage, error) {
	switch f.storage {
	case "durable":
		return pgratelimit.Durable, nil
	case "ephemeral":
		return pgratelimit.Ephemeral, nil
	}
	return 0, usagef("--storage must be durable or ephemeral, got %q", f.storage)
}

// configFlags are the flags of the Config and SemaphoreConfig fields that
// the commands set, by pgratelimit.ConfigError.Field.
var configFlags = map[string]string{
	"Config.Prefix": "--prefix", "Config.Capacity": "--capacity", "Config.Refill": "--refill", "Config.Interval": "--interval",
	"Config.Calendar.Every": "--every", "Config.Storage": "--storage",
	"Config.Alerts": "--alerts", "Config.AsyncCommit": "--commit async", "Config.DenyCacheSize": "--deny-cache", // (bench's)
	"SemaphoreConfig.Prefix": "--prefix", "SemaphoreConfig.Max": "--max", "SemaphoreConfig.TTL": "--ttl",
	"SemaphoreConfig.Storage": "--storage", "SemaphoreConfig.MaxWait": "--timeout",
}

// configError is err of pgratelimit.New or NewSemaphore in the flags'
// terms: the field the library's ConfigError names becomes its flag
// ("--capacity must be > 0, got 0").
func configError(err error) error {
	var ce *pgratelimit.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	if fl, ok := configFlags[ce.Field]; ok {
		return usagef("%s %s", fl, ce.Reason)
	}
	return usagef("%s %s", ce.Field, ce.Reason)
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

// limiter opens a pool and a limiter of the policy flags, or of the policy
// the prefix's limiters recorded when no policy flag is given (see
// storedPolicy); done closes the pool. The CLI's client records no policy
// of its own.
func (f *flags) limiter(ctx context.Context) (l *pgratelimit.Limiter, done func(), err error) {
	cfg, err := f.config()
	if err != nil {
		return nil, nil, err
	}
	pool, err := f.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	f.db = pool
	qctx, cancel := f.withTimeout(ctx)
	defer cancel()
	if cfg, err = f.storedPolicy(qctx, pool, cfg); err != nil {
		// The database did not answer: the command's input is still checked
		// (by the library, before any database access: see unreachable),
		// and the error is this one.
		f.unreachable = err
		l, err = pgratelimit.New(pool, cfg)
	} else {
		var client *pgratelimit.Client
		client, err = pgratelimit.NewClient(qctx, pool, pgratelimit.ClientConfig{DisablePolicyRecord: true})
		if err == nil {
			l, err = client.NewLimiter(cfg)
		}
	}
	if err != nil {
		pool.Close()
		return nil, nil, configError(err)
	}
	return l, pool.Close, nil
}

// printJSON prints v as a line of JSON on stdout.
func (f *flags) printJSON(v any) {
	_ = json.NewEncoder(f.c.stdout).Encode(v)
}

// emit prints j as a line of JSON with --json, else line.
func (f *flags) emit(j any, line string) {
	if f.json {
		f.printJSON(j)
	} else {
		fmt.Fprintln(f.c.stdout, line)
	}
}
