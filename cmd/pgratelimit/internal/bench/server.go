package bench

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench/cpu"
)

// serverCPU is the CPU time so far of the PostgreSQL server behind pool,
// when it runs on this machine: its postmaster and everything it started
// (cpu.Tree). 0 when it cannot be read (a remote server, or /proc hidden).
// On Citus it is the coordinator's: the workers' is theirs to read.
func serverCPU(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0
	}
	postmaster, ok := cpu.Postmaster(pid)
	if !ok {
		return 0
	}
	return cpu.Tree(postmaster)
}
