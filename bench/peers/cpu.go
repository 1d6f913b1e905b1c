package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU time on Linux, as the harness reads it for every contender: an
// exited child's (getrusage), any process's from /proc/PID/stat, a server's
// (the process and every process it started), and the whole machine's from
// /proc/stat. (The CLI's internal/bench/cpu reads a server's the same way
// for `pgratelimit bench`; this module builds on its own, GOWORK=off.)
// Every function returns zero values, or false, when the figures cannot be
// read (another operating system, /proc hidden, a process gone).

// clockTick is the kernel's USER_HZ, the unit of the CPU times in /proc: 100
// on Linux.
const clockTick = 100

// cpuExited is the CPU time, user and system, of a child process that has
// exited (its ProcessState, from exec.Cmd.Wait); 0 for nil.
func cpuExited(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procStat is what /proc/PID/stat says of a process.
type procStat struct {
	// PPID is the parent's process ID.
	PPID int
	// Self is the CPU time of the process (all its threads), Children that
	// of its children that it has waited for (reaped), user and system.
	Self, Children time.Duration
}

// Total is the process's own CPU time and its reaped children's.
func (s procStat) Total() time.Duration { return s.Self + s.Children }

// cpuProcess reads /proc/PID/stat; false when it cannot.
func cpuProcess(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields from the last ')'. Then state is field 3, ppid 4, utime
	// 14, stime 15, cutime 16, cstime 17.
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	tick := func(v int64) time.Duration { return time.Duration(v) * time.Second / clockTick }
	return procStat{PPID: int(n(1)), Self: tick(n(11) + n(12)), Children: tick(n(13) + n(14))}, true
}

// childrenOf lists the live processes whose parent is pid.
func childrenOf(pid int) []int {
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
		if s, ok := cpuProcess(p); ok && s.PPID == pid {
			out = append(out, p)
		}
	}
	return out
}

// cpuTree is the CPU time so far of process pid and of everything it
// started: its own, its reaped children's (for a PostgreSQL postmaster, the
// backends of closed connections: the kernel adds a reaped child's time to
// its parent's), and each live child's. 0 when pid cannot be read.
func cpuTree(pid int) time.Duration {
	st, ok := cpuProcess(pid)
	if !ok {
		return 0
	}
	total := st.Total()
	for _, c := range childrenOf(pid) {
		if s, ok := cpuProcess(c); ok {
			total += s.Total()
		}
	}
	return total
}

// machineCPU returns the busy and total CPU time of the whole machine so
// far, all cores together, from /proc/stat (busy: all but idle and iowait).
func machineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 2 {
		return 0, 0
	}
	var busyTicks, totalTicks int64
	for i, s := range f[1:min(len(f), 9)] {
		n, _ := strconv.ParseInt(s, 10, 64)
		totalTicks += n
		if i != 3 && i != 4 { // idle, iowait
			busyTicks += n
		}
	}
	tick := time.Second / clockTick
	return time.Duration(busyTicks) * tick, time.Duration(totalTicks) * tick
}
