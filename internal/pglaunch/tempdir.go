package pglaunch

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ownerFile, in a directory TempDir made, holds the PID of the process that
// made it.
const ownerFile = "pglaunch.owner"

// TempDir makes a directory in os.TempDir() named pattern and a random
// string (as os.MkdirTemp), noting that this process owns it. It first
// removes the directories of that pattern whose owner is gone: the servers
// of a process killed outright die with it (see StartTied), but their
// directories stay until then.
func TempDir(pattern string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), pattern+"*"))
	for _, d := range old {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours to judge, or being made
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}
