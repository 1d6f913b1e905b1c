// Package readme checks the documentation: that the Go code in README.md and
// docs/*.md is code the build compiles (make test, with go vet and go test,
// compiles the files this test compares the blocks with), and that every
// relative link in the repository's Markdown files resolves, anchors
// included (links_test.go).
package readme

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// compiled are the files, relative to the repository's root, whose code the
// README's blocks are found in: a block that is a whole program is one of
// programs; any other (an Example function, or a fragment of one) appears,
// line for line, in one of fragments. TestREADMERuns runs them.
var (
	programs  = []string{"internal/readme/quickstart/main.go"}
	fragments = []string{
		"pgratelimit/example_test.go",
		"pgratelimit/readme_example_test.go",
		"pgratelimit/events/example_test.go",
		"pgratelimit/lease_example_test.go",
		"pgratelimit/httplimit/readme_example_test.go",
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
			code := normalize(blk.code)
			var found bool
			if strings.HasPrefix(code, "package main\n") {
				found = contains(progs, func(p string) bool { return p == code })
			} else {
				found = contains(frags, func(f string) bool { return strings.Contains("\n"+f, "\n"+code) })
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
	code string
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
