package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// clientCPU is this process's CPU time so far (user and system).
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the CPU time so far of the PostgreSQL server behind q (a
// pool or a connection), when it runs on this machine: its postmaster (with
// the children it has reaped) and every live child. 0 when it cannot be
// read (a remote server, or /proc hidden).
func serverCPU(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) time.Duration {
	var pid int
	if err := q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0
	}
	st, ok := procStat(pid)
	if !ok {
		return 0
	}
	postmaster := st.ppid
	pm, ok := procStat(postmaster)
	if !ok || !strings.Contains(pm.comm, "postgres") {
		return 0
	}
	total := pm.self + pm.children
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		p, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if s, ok := procStat(p); ok && s.ppid == postmaster {
			total += s.self
		}
	}
	return total
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

type stat struct {
	comm           string
	ppid           int
	self, children time.Duration
}

// clockTick is the kernel's USER_HZ, 100 on Linux.
const clockTick = 100

// procStat reads /proc/PID/stat.
func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return stat{}, false
	}
	f := strings.Fields(s[end+1:]) // from field 3 (state) on
	if len(f) < 15 {
		return stat{}, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	tick := func(v int64) time.Duration { return time.Duration(v) * time.Second / clockTick }
	return stat{
		comm:     s[open+1 : end],
		ppid:     int(n(1)),
		self:     tick(n(11) + n(12)),
		children: tick(n(13) + n(14)),
	}, true
}
