package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clientCPU is this process's CPU time so far (user and system).
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the CPU time so far of the PostgreSQL server behind pool,
// when it runs on this machine: its postmaster (with the children it has
// reaped) and every live child. 0 when it cannot be read (a remote server,
// or /proc hidden).
func serverCPU(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
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
