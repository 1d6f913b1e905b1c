// Package readme checks the documentation: that the Go code in README.md and
// docs/*.md is code the build compiles (make test, with go vet and go test,
// compiles the files this test compares the blocks with), that the README's
// blocks run as a reader pastes them, twice (run_test.go), that its figures
// are docs/performance.md's (figures_test.go), and that every relative link
// in the repository's Markdown files resolves, anchors included
// (links_test.go).
package readme

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// compiled are the files, relative to the repository's root, whose code the
// documentation's blocks are found in: a block that is a whole program is
// one of programs; any other (a _test.go file of package main holding an
// Example function, or in docs/*.md a fragment of one) appears, line for
// line after its package clause and imports, in one of fragments.
// TestREADMERuns runs the README's.
var (
	programs  = []string{"internal/readme/quickstart/main.go"}
	fragments = []string{
		"pgratelimit/example_test.go",
		"pgratelimit/readme_example_test.go",
		"pgratelimit/events/example_test.go",
		"pgratelimit/lease_example_test.go",
		"pgratelimit/httplimit/readme_example_test.go",
		"pgratelimit/ui/example_test.go",
		"grpclimit/example_test.go",
		"connectlimit/example_test.go",
	}
)

func TestREADMECodeCompiles(t *testing.T) {
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var progs, frags []string
	for _, p := range programs {
		progs = append(progs, normalize(read(p)))
	}
	for _, f := range fragments {
		frags = append(frags, normalize(read(f)))
	}
	n := 0
	for _, doc := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, blk := range goBlocks(string(b)) {
			n++
			if rel == "README.md" && !strings.HasPrefix(blk.code, "package ") {
				t.Errorf("%s:%d: this Go block is not a whole file: show it with its package clause and imports, as a reader pastes it", rel, blk.line)
				continue
			}
			code := normalize(blk.code)
			var found bool
			if isProgram(blk.code) {
				found = contains(progs, func(p string) bool { return p == code })
			} else {
				body := normalize(withoutHeader(blk.code))
				found = contains(frags, func(f string) bool { return strings.Contains("\n"+f, "\n"+body) })
			}
			if !found {
				t.Errorf("%s:%d: this Go block is not compiled code: make it a whole program in one of %v, or put it, line for line, in an example in one of %v",
					rel, blk.line, programs, fragments)
			}
		}
	}
	if n == 0 {
		t.Fatal("no Go blocks found in README.md and docs/*.md")
	}
	t.Logf("%d Go blocks, each compiled", n)
}

func contains(ss []string, f func(string) bool) bool {
	for _, s := range ss {
		if f(s) {
			return true
		}
	}
	return false
}

type block struct {
	line int // of the opening fence, 1-based
	end  int // of the closing fence, 1-based
	code string
}

// isProgram reports whether a block is a whole program (one with a main).
func isProgram(code string) bool { return strings.Contains(code, "\nfunc main() {") }

// withoutHeader is code without its package clause and imports: the
// Example function (or fragment) that sits in a compiled file.
func withoutHeader(code string) string {
	lines := strings.Split(code, "\n")
	i := 0
	for i < len(lines) {
		l := strings.TrimSpace(lines[i])
		switch {
		case l == "" || strings.HasPrefix(l, "package "):
			i++
		case l == "import (":
			for i < len(lines) && strings.TrimSpace(lines[i]) != ")" {
				i++
			}
			i++
		case strings.HasPrefix(l, "import "):
			i++
		default:
			return strings.Join(lines[i:], "\n")
		}
	}
	return ""
}

// goBlocks returns the ```go blocks of a Markdown text.
func goBlocks(md string) []block {
	var out []block
	var cur *block
	var body []string
	for i, l := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```go"):
			cur, body = &block{line: i + 1}, nil
		case cur != nil && strings.HasPrefix(l, "```"):
			cur.end = i + 1
			cur.code = strings.Join(body, "\n")
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body = append(body, l)
		}
	}
	return out
}

// normalize trims each line and drops blank ones, so that a fragment matches
// the example that holds it at any indentation; it ends with a newline.
func normalize(code string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(code, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			fmt.Fprintln(&b, l)
		}
	}
	return b.String()
}
