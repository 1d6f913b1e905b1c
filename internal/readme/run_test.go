package readme

import (
	"bytes"
	"context"
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

// TestREADMERuns does what the README asks of a reader, on one fresh
// database: it makes a module of its own with the Install section's
// `go mod edit -replace` lines (the clone being this working tree; once
// released, with none, it replaces the library and the adapters), pastes
// every Go block into it as the README shows it (the program, the quick
// start, as main.go; each block holding an Example as a _test.go file next
// to it), runs go mod tidy, and then runs everything twice: the program
// with go run, the examples with go test. The first time, the program must
// print what the README says it prints ("prints `...`" after it) and each
// example must pass (go test checks its // Output:). The second time, each
// must print what the README says of a second run: the paragraph after the
// block that says "second run", where "prints the same" allows the first
// run's output, "prints nothing" an empty one, each `code span` after "second run" that
// output, and a ```text block right after the paragraph that output.
func TestREADMERuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the README's programs and examples with the go command")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	blocks := goBlocks(md)
	var program *block
	var examples []block
	for i, blk := range blocks {
		switch {
		case isProgram(blk.code):
			if program != nil {
				t.Fatalf("README.md:%d: a second program; the test runs one, the quick start (README.md:%d)", blk.line, program.line)
			}
			program = &blocks[i]
		case exampleName(blk.code) != "":
			examples = append(examples, blk)
		default:
			t.Errorf("README.md:%d: neither a program nor an Example: the test cannot run it", blk.line)
		}
	}
	if program == nil || len(examples) == 0 {
		t.Fatalf("found a program: %v, and %d examples in README.md; expected both", program != nil, len(examples))
	}

	mod := newScratchModule(t, root, md)
	mod.write(t, "main.go", program.code)
	adapters := false
	for _, ex := range examples {
		mod.write(t, strings.ToLower(exampleName(ex.code))+"_test.go", ex.code)
		adapters = adapters || strings.Contains(ex.code, "github.com/pgratelimit/pgratelimit/grpclimit\"") ||
			strings.Contains(ex.code, "github.com/pgratelimit/pgratelimit/connectlimit\"")
	}
	mod.tidy(t)
	if adapters {
		// Install says what go mod tidy writes when an adapter is imported.
		gomod := mod.read(t, "go.mod")
		if !regexp.MustCompile(`(?m)^\s*(require\s+)?github\.com/pgratelimit/pgratelimit v0\.1\.0$`).MatchString(gomod) {
			t.Errorf("README.md's Install says go mod tidy requires github.com/pgratelimit/pgratelimit v0.1.0 with an adapter; go.mod is:\n%s", gomod)
		}
	}

	url := testdb.NewEmptySchema(t).URL(t) // no tables: the quick start migrates
	lines := strings.Split(md, "\n")
	next := func(blk block) int { // the line of the block after blk, or the end
		for _, b := range blocks {
			if b.line > blk.line {
				return b.line - 1
			}
		}
		return len(lines)
	}

	// The first run: what the README says each prints.
	firstProgram := mod.run(t, url)
	if want := statedOutput(t, md, *program); firstProgram != want {
		t.Errorf("README.md:%d: the program printed %q; the README says it prints %q", program.line, firstProgram, want)
	}
	firstExamples := mod.test(t, url, examples)
	for _, ex := range examples {
		name := exampleName(ex.code)
		if got, want := firstExamples[name], exampleOutput(ex.code); got != want {
			t.Errorf("README.md:%d: %s printed %q on a fresh database; its // Output: is %q", ex.line, name, got, want)
		}
	}

	// The second run, on the same database: what the README says of it.
	check := func(blk block, name, first, got string) {
		allowed, ok := secondRun(lines, blk.end, next(blk), first)
		if !ok {
			t.Errorf("README.md:%d: no paragraph after %s says what a second run prints", blk.line, name)
			return
		}
		if !slices.Contains(allowed, got) {
			t.Errorf("README.md:%d: the second run of %s printed %q; the README allows %q", blk.line, name, got, allowed)
		}
	}
	check(*program, "the program", strings.TrimSpace(firstProgram), strings.TrimSpace(mod.run(t, url)))
	secondExamples := mod.test(t, url, examples)
	for _, ex := range examples {
		name := exampleName(ex.code)
		check(ex, name, firstExamples[name], secondExamples[name])
	}
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

var (
	exampleFunc = regexp.MustCompile(`(?m)^func (Example\w*)\(\) \{`)
	codeSpan    = regexp.MustCompile("`([^`]*)`")
)

// exampleName is the name of the Example function in code, or "".
func exampleName(code string) string {
	if m := exampleFunc.FindStringSubmatch(code); m != nil {
		return m[1]
	}
	return ""
}

// exampleOutput is an example's // Output:, as go test compares it
// (trimmed).
func exampleOutput(code string) string {
	_, after, ok := strings.Cut(code, "// Output:")
	if !ok {
		return ""
	}
	var out []string
	for i, l := range strings.Split(after, "\n") {
		l = strings.TrimSpace(l)
		if i > 0 {
			if !strings.HasPrefix(l, "//") {
				break
			}
			l = strings.TrimPrefix(strings.TrimPrefix(l, "//"), " ")
		}
		out = append(out, l)
	}
	return strings.TrimSpace(strings.Join(out, "\n"))
}

// secondRun returns the outputs the README allows a block's second run,
// from what lines[from:to] (the prose after the block, up to the next Go
// block) say of it; ok is false if nothing does. first is the first run's
// output, which "prints the same" allows.
func secondRun(lines []string, from, to int, first string) (allowed []string, ok bool) {
	fence := false
	var para []string
	for i := from; i <= to && i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if !fence && strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "```") {
			para = append(para, l)
			continue
		}
		text := strings.Join(para, " ")
		para = nil
		k := strings.Index(strings.ToLower(text), "second run")
		if k < 0 {
			continue
		}
		said := text[k:]
		if strings.Contains(said, "prints the same") {
			allowed = append(allowed, first)
		}
		if strings.Contains(said, "prints nothing") {
			allowed = append(allowed, "")
		}
		for _, m := range codeSpan.FindAllStringSubmatch(said, -1) {
			allowed = append(allowed, m[1])
		}
		// A ```text block right after the paragraph.
		j := i
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j < len(lines) && strings.HasPrefix(lines[j], "```text") {
			var out []string
			for j++; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
				out = append(out, lines[j])
			}
			allowed = append(allowed, strings.TrimSpace(strings.Join(out, "\n")))
		}
		return allowed, true
	}
	return nil, false
}

// scratchModule is a module outside the repository, made as the README's
// Install section says.
type scratchModule struct {
	dir, goBin string
}

// installReplace are the Install section's replace lines.
var installReplace = regexp.MustCompile(`(?m)^\s+go mod edit -replace (\S+)=\$HOME/src/pgratelimit(\S*)`)

func newScratchModule(t *testing.T, root, md string) scratchModule {
	t.Helper()
	goBin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	m := scratchModule{dir: t.TempDir(), goBin: goBin}
	m.goCmd(t, "", "mod", "init", "example.com/readme")
	replaces := installReplace.FindAllStringSubmatch(md, -1)
	if len(replaces) == 0 { // released: no clone to replace with, but the test is of this tree
		const lib = "github.com/pgratelimit/pgratelimit"
		replaces = [][]string{{"", lib, ""}, {"", lib + "/grpclimit", "/grpclimit"}, {"", lib + "/connectlimit", "/connectlimit"}}
	}
	// The tree's go.sum files, so that go mod tidy needs no checksum database
	// for what the module cache holds.
	var sum []byte
	for _, r := range replaces {
		dir := filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(r[2], "/")))
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil || !strings.HasPrefix(string(gomod), "module "+r[1]+"\n") {
			t.Fatalf("README.md's Install replaces %s with the clone's %s, which is not that module (%v)", r[1], r[2]+"/", err)
		}
		m.goCmd(t, "", "mod", "edit", "-replace", r[1]+"="+dir)
		b, err := os.ReadFile(filepath.Join(dir, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sum = append(sum, b...)
	}
	m.write(t, "go.sum", string(sum))
	return m
}

func (m scratchModule) write(t *testing.T, name, code string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.dir, name), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (m scratchModule) read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (m scratchModule) tidy(t *testing.T) {
	t.Helper()
	m.goCmd(t, "", "mod", "tidy")
}

// run runs the program (main.go) and returns what it printed.
func (m scratchModule) run(t *testing.T, url string) string {
	t.Helper()
	out, err := m.goRun(url, "run", ".")
	if err != nil {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	return out
}

// test runs the examples with go test and returns what each printed (as go
// test compares it with its // Output:, trimmed).
func (m scratchModule) test(t *testing.T, url string, examples []block) map[string]string {
	t.Helper()
	out, err := m.goRun(url, "test", "-count=1", "-v", ".")
	printed := map[string]string{}
	for _, ex := range examples {
		name := exampleName(ex.code)
		switch {
		case strings.Contains(out, "--- PASS: "+name+" "):
			printed[name] = exampleOutput(ex.code)
		case strings.Contains(out, "--- FAIL: "+name+" "):
			rest := out[strings.Index(out, "--- FAIL: "+name+" "):]
			_, got, ok1 := strings.Cut(rest, "\ngot:\n")
			got, _, ok2 := strings.Cut(got, "\nwant:\n")
			if !ok1 || !ok2 {
				t.Fatalf("go test: %s failed without got and want:\n%s", name, out)
			}
			printed[name] = strings.TrimSpace(got)
		default:
			t.Fatalf("go test did not run %s (%v):\n%s", name, err, out)
		}
	}
	return printed
}

func (m scratchModule) goCmd(t *testing.T, url string, args ...string) string {
	t.Helper()
	out, err := m.goRun(url, args...)
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// goRun runs the go command in the module, on the database at url, and
// returns its standard output (with its standard error after it if it fails).
func (m scratchModule) goRun(url string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.goBin, args...)
	cmd.Dir = m.dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// The second run's statements, on the README's forms.
func TestSecondRunStatements(t *testing.T) {
	md := strings.Join([]string{
		"```go", "code", "```", // 0-2
		"", "Prose with `code` before.", "A second run prints `a=1` within", "the second, `a=2` after.", // 3-6
		"", "```go", "code", "```", // 7-10
		"", "A second run prints the same once the minute has turned; within it:", "", "```text", "x 1", "y 2", "```", // 11-17
		"", "```go", "code", "```", // 18-21
		"", "A second run in the same month prints nothing.", // 22-23
		"", "```go", "code", "```", "", "Nothing said of it.", // 24-29
	}, "\n")
	lines := strings.Split(md, "\n")
	for _, c := range []struct {
		from, to int
		want     []string
		ok       bool
	}{
		{3, 8, []string{"a=1", "a=2"}, true},
		{11, 19, []string{"first", "x 1\ny 2"}, true},
		{22, 25, []string{""}, true},
		{28, len(lines), nil, false},
	} {
		got, ok := secondRun(lines, c.from, c.to, "first")
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("secondRun(lines %d-%d) = %q, %v; want %q, %v", c.from, c.to, got, ok, c.want, c.ok)
		}
	}
	if got := exampleOutput("func Example() {\n\t// Output:\n\t// a\n\t//\n\t// b\n}"); got != "a\n\nb" {
		t.Errorf("exampleOutput = %q", got)
	}
	if got := exampleOutput("func Example() {\n\t// Output: left: 9\n}"); got != "left: 9" {
		t.Errorf("exampleOutput = %q", got)
	}
}
