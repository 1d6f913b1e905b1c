package cpu

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	// Spend a little CPU, so that every figure has something to show.
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	if Self() <= 0 {
		t.Fatal("Self: no CPU time")
	}
	st, ok := Process(os.Getpid())
	if !ok {
		t.Fatal("Process: cannot read this process")
	}
	if st.PPID != os.Getppid() {
		t.Errorf("PPID %d, want %d", st.PPID, os.Getppid())
	}
	if st.Comm == "" {
		t.Error("no command name")
	}
	if _, ok := Process(-1); ok {
		t.Error("Process(-1) read something")
	}
	if _, ok := Postmaster(os.Getpid()); ok {
		t.Error("Postmaster: the test's parent is not PostgreSQL")
	}
}

func TestChildren(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep command:", err)
	}
	// Spend CPU well beyond /proc's clock ticks (10ms), which Tree reads
	// and Self, from getrusage, does not round to.
	for Self() < 100*time.Millisecond {
	}
	found := false
	for _, p := range ChildrenOf(os.Getpid()) {
		found = found || p == cmd.Process.Pid
	}
	if !found {
		t.Errorf("ChildrenOf: %d is not among this process's children", cmd.Process.Pid)
	}
	if Tree(os.Getpid()) < Self()/2 {
		t.Error("Tree: less than this process's own CPU time")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}
