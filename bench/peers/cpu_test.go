package main

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
)

func TestCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	st, ok := cpuProcess(os.Getpid())
	if !ok || st.PPID != os.Getppid() {
		t.Fatalf("cpuProcess: %+v, %v; want the parent %d", st, ok, os.Getppid())
	}
	if _, ok := cpuProcess(-1); ok {
		t.Error("cpuProcess(-1) read something")
	}
	if busy, total := machineCPU(); busy <= 0 || total < busy {
		t.Errorf("machineCPU: busy %s of %s", busy, total)
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep command:", err)
	}
	found := false
	for _, p := range childrenOf(os.Getpid()) {
		found = found || p == cmd.Process.Pid
	}
	if !found {
		t.Errorf("childrenOf: %d is not among this process's children", cmd.Process.Pid)
	}
	if cpuTree(os.Getpid()) < st.Total() {
		t.Error("cpuTree: less than this process's own CPU time before")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if cpuExited(cmd.ProcessState) < 0 || cpuExited(nil) != 0 {
		t.Error("cpuExited: negative, or not 0 for nil")
	}
}
