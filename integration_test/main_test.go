// Package integration tests pgratelimit against a real PostgreSQL (see
// internal/testdb for where it comes from).
package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/pgratelimit/pgratelimit/integration_test/dockerdb"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

func TestMain(m *testing.M) {
	testdb.Container = dockerdb.Start
	testdb.Main(modes{m})
}

// modes runs the suite once per coalescing mode, as River's driver suite
// runs once per driver: coalescing (the default) and per-check
// (Config.DisableCoalescing). PGRATELIMIT_TEST_MODE=coalesce or per-check
// runs one of them.
type modes struct{ m *testing.M }

func (ms modes) Run() int {
	code := 0
	for _, mode := range []string{"coalesce", "per-check"} {
		if want := os.Getenv("PGRATELIMIT_TEST_MODE"); want != "" && want != mode {
			continue
		}
		fmt.Printf("pgratelimit integration suite: %s\n", mode)
		perCheck = mode == "per-check"
		if c := ms.m.Run(); c != 0 {
			code = c
		}
	}
	return code
}
