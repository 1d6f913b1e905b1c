package bench

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench/cpu"
)

// serverCPU is the CPU time so far of the PostgreSQL server behind q (a
// pool or a connection), when it runs on this machine: its postmaster and
// everything it started (cpu.Tree). 0 when it cannot be read (a remote
// server, or /proc hidden).
func serverCPU(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) time.Duration {
	var pid int
	if err := q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0
	}
	postmaster, ok := cpu.Postmaster(pid)
	if !ok {
		return 0
	}
	return cpu.Tree(postmaster)
}

// workers are a Citus cluster's worker nodes (active primaries other than
// the coordinator), each with a connection made with admin's settings,
// host and port replaced, to read its server's CPU time. Nodes it cannot
// connect to have a nil connection.
type workers struct {
	names []string
	conns []*pgx.Conn
}

func connectWorkers(ctx context.Context, admin *pgx.Conn) (*workers, error) {
	rows, err := admin.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
WHERE noderole = 'primary' AND isactive AND groupid <> 0 ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	w := &workers{}
	for rows.Next() {
		var host string
		var port int32
		if err := rows.Scan(&host, &port); err != nil {
			w.close(ctx)
			return nil, err
		}
		cfg := admin.Config().Copy()
		cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(port), nil
		if cfg.TLSConfig != nil {
			cfg.TLSConfig = cfg.TLSConfig.Clone()
			cfg.TLSConfig.ServerName = host
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			conn = nil // its CPU reads as 0
		}
		w.names = append(w.names, net.JoinHostPort(host, strconv.Itoa(int(port))))
		w.conns = append(w.conns, conn)
	}
	if err := rows.Err(); err != nil {
		w.close(ctx)
		return nil, err
	}
	return w, nil
}

// cpu is each worker's server CPU time so far (0: not readable).
func (w *workers) cpu(ctx context.Context) []time.Duration {
	ts := make([]time.Duration, len(w.conns))
	for i, c := range w.conns {
		if c != nil {
			ts[i] = serverCPU(ctx, c)
		}
	}
	return ts
}

func (w *workers) close(ctx context.Context) {
	for _, c := range w.conns {
		if c != nil {
			_ = c.Close(ctx)
		}
	}
}
