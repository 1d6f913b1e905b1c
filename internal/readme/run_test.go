package readme

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestREADMERuns does what the README asks of a reader, top to bottom, on
// one fresh database: each block that is a whole program is run with go
// run, in a module of its own that uses this repository through a replace
// directive (as Install says), and must print what the README says it
// prints; each block that is an Example function goes, as it is, into a
// _test.go file of that module, and go test runs it and checks its
// // Output:. The other blocks are fragments of examples that other
// packages' tests run (TestREADMECodeCompiles finds them there).
func TestREADMERuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the README's programs and examples with the go command")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	mod := newScratchModule(t, root)
	url := testdb.NewEmptySchema(t).URL(t) // no tables: the quick start migrates
	var examples []string
	programs := 0
	for _, blk := range goBlocks(string(md)) {
		switch {
		case strings.HasPrefix(blk.code, "package main\n"):
			programs++
			want := statedOutput(t, string(md), blk)
			got := mod.run(t, url, fmt.Sprintf("prog%d", programs), blk.code)
			if got != want {
				t.Errorf("README.md:%d: the program printed %q; the README says it prints %q", blk.line, got, want)
			}
		case strings.HasPrefix(blk.code, "func Example"):
			examples = append(examples, blk.code)
		default:
			t.Logf("README.md:%d: a fragment, not run here", blk.line)
		}
	}
	if programs == 0 || len(examples) == 0 {
		t.Fatalf("found %d programs and %d examples in README.md; expected both", programs, len(examples))
	}
	mod.test(t, url, examples)
}

// statedOutput is what the README says the program of blk prints: the
// first "prints `...`" after it.
func statedOutput(t *testing.T, md string, blk block) string {
	t.Helper()
	lines := strings.Split(md, "\n")
	rest := strings.Join(lines[blk.line:], "\n")
	m := regexp.MustCompile("prints `([^`]*)`").FindStringSubmatch(rest)
	if m == nil {
		t.Fatalf("README.md:%d: no \"prints `...`\" after this program says what it prints", blk.line)
	}
	return m[1] + "\n"
}

// scratchModule is a module outside the repository that requires the
// library and replaces it with the working tree.
type scratchModule struct {
	dir, goBin string
}

func newScratchModule(t *testing.T, root string) scratchModule {
	t.Helper()
	dir := t.TempDir()
	gomod := fmt.Sprintf(`module example.com/readme

go 1.25

require github.com/pgratelimit/pgratelimit v0.0.0-00010101000000-000000000000

replace github.com/pgratelimit/pgratelimit => %s
`, root)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum")) // the library's dependencies
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	return scratchModule{dir: dir, goBin: goBin}
}

// run writes code as package sub of the module and runs it.
func (m scratchModule) run(t *testing.T, url, sub, code string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(m.dir, sub), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, sub, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	return m.goCmd(t, url, "run", "./"+sub)
}

// test writes the examples, in order, into one _test.go file with the
// imports they use, and runs go test on it (which checks each Output).
func (m scratchModule) test(t *testing.T, url string, examples []string) {
	t.Helper()
	body := strings.Join(examples, "\n\n") + "\n"
	src := "package examples_test\n\nimport (\n" + imports(body) + ")\n\n" + body
	if err := os.MkdirAll(filepath.Join(m.dir, "examples"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, "examples", "readme_test.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := m.goCmd(t, url, "test", "-count=1", "-v", "./examples")
	for _, ex := range examples {
		name := strings.TrimSuffix(strings.Fields(ex)[1], "()")
		if !strings.Contains(out, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass:\n%s", name, out)
		}
	}
}

func (m scratchModule) goCmd(t *testing.T, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.goBin, args...)
	cmd.Dir = m.dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "GOWORK=off", "GOFLAGS=-mod=mod")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// knownImports are the packages the README's examples may use, by name.
var knownImports = map[string]string{
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"httptest":    "net/http/httptest",
	"log":         "log",
	"netip":       "net/netip",
	"os":          "os",
	"slog":        "log/slog",
	"strings":     "strings",
	"time":        "time",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"stdlib":      "github.com/jackc/pgx/v5/stdlib",
	"migrations":  "github.com/pgratelimit/pgratelimit/migrations",
	"pgratelimit": "github.com/pgratelimit/pgratelimit/pgratelimit",
	"httplimit":   "github.com/pgratelimit/pgratelimit/pgratelimit/httplimit",
}

// imports is the import block's body for the packages code refers to.
func imports(code string) string {
	var paths []string
	for name, path := range knownImports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(code) {
			paths = append(paths, path)
		}
	}
	slices.Sort(paths)
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "\t%q\n", p)
	}
	return b.String()
}
