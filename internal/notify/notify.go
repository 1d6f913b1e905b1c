// Package notify listens for PostgreSQL notifications on a connection of
// its own: the one LISTEN loop of the library, and its one check that
// notifications can arrive at all. A semaphore's Wait and the events
// consumer use it; each polls as its fallback (through PgBouncer in
// transaction mode LISTEN is never delivered).
package notify

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// ErrPooler is the error of a connection that goes through a pooler (the
// backend that answers is not the one the connection was opened with, as
// through PgBouncer in transaction mode): a LISTEN there would never
// deliver a notification, so the caller should poll instead.
var ErrPooler = errors.New("connected through a pooler: LISTEN would not be delivered")

// connectTimeout bounds the connection and the LISTEN.
const connectTimeout = 10 * time.Second

// Listener says what to do with a listening connection. Got is required.
type Listener struct {
	// Channel is the channel to LISTEN on.
	Channel string
	// Ready, when set, is called once the LISTEN is in place: the caller
	// should look for what was sent while the connection was being made.
	Ready func()
	// Got is called with the payload of each notification.
	Got func(payload string)
	// Idle, when set, is asked about once a second while no notification
	// comes; when it says true, Listen returns nil.
	Idle func() bool
}

// Listen connects with cfg, checks that the connection talks to its own
// backend (else ErrPooler), LISTENs on l.Channel and hands notifications
// to l.Got until ctx ends or l.Idle says so (then nil), or the connection
// fails (its error; the caller may try again later).
func Listen(ctx context.Context, cfg *pgx.ConnConfig, l Listener) error {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var pid uint32
	if err := conn.QueryRow(cctx, sqlgen.BackendPID).Scan(&pid); err != nil {
		return err
	}
	if pid != conn.PgConn().PID() {
		return ErrPooler
	}
	if _, err := conn.Exec(cctx, sqlgen.Listen(l.Channel)); err != nil {
		return err
	}
	if l.Ready != nil {
		l.Ready()
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			l.Got(n.Payload)
		case ctx.Err() != nil:
			return nil
		case wctx.Err() == nil || conn.IsClosed():
			return err
		case l.Idle != nil && l.Idle():
			return nil
		}
	}
}
