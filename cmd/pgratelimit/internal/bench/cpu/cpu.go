// Package cpu reads CPU time on Linux: this process's (getrusage), any
// process's from /proc/PID/stat, and a PostgreSQL server's (its postmaster
// and every process it started). The benchmark reads its own and its
// server's CPU with it. (The peer harness, bench/peers, reads the same
// figures of every contender with its own copy: it is another module.)
//
// Every function returns zero values, or false, when the figures cannot be
// read (another operating system, /proc hidden, a process gone).
package cpu

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the kernel's USER_HZ, the unit of the CPU times in /proc: 100
// on Linux.
const clockTick = 100

// Self is this process's CPU time so far, user and system.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Stat is what /proc/PID/stat says of a process.
type Stat struct {
	// Comm is the command name, such as "postgres".
	Comm string
	// PPID is the parent's process ID.
	PPID int
	// Self is the CPU time of the process (all its threads), Children that
	// of its children that it has waited for (reaped), user and system.
	Self, Children time.Duration
}

// Total is the process's own CPU time and its reaped children's.
func (s Stat) Total() time.Duration { return s.Self + s.Children }

// Process reads /proc/PID/stat; false when it cannot.
func Process(pid int) (Stat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields from the last ')'. Then state is field 3, ppid 4, utime
	// 14, stime 15, cutime 16, cstime 17.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return Stat{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 15 {
		return Stat{}, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	tick := func(v int64) time.Duration { return time.Duration(v) * time.Second / clockTick }
	return Stat{
		Comm:     s[open+1 : end],
		PPID:     int(n(1)),
		Self:     tick(n(11) + n(12)),
		Children: tick(n(13) + n(14)),
	}, true
}

// ChildrenOf lists the live processes whose parent is pid.
func ChildrenOf(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, d := range ents {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if s, ok := Process(p); ok && s.PPID == pid {
			out = append(out, p)
		}
	}
	return out
}

// Tree is the CPU time so far of process pid and of everything it started:
// its own, its reaped children's (for a PostgreSQL postmaster, the backends
// of closed connections: the kernel adds a reaped child's time to its
// parent's), and each live child's. 0 when pid cannot be read.
func Tree(pid int) time.Duration {
	st, ok := Process(pid)
	if !ok {
		return 0
	}
	total := st.Total()
	for _, c := range ChildrenOf(pid) {
		if s, ok := Process(c); ok {
			total += s.Total()
		}
	}
	return total
}

// Postmaster returns the PostgreSQL postmaster of the backend with process
// ID backend (its parent, a process named postgres), when both run on this
// machine.
func Postmaster(backend int) (int, bool) {
	st, ok := Process(backend)
	if !ok {
		return 0, false
	}
	pm, ok := Process(st.PPID)
	if !ok || !strings.Contains(pm.Comm, "postgres") {
		return 0, false
	}
	return st.PPID, true
}
