package readme

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// figuresHeading is the heading of docs/performance.md above the table the
// README's Performance section copies: the one source of the README's
// throughput figures.
const figuresHeading = "### The README's figures"

// TestREADMEFigures checks that the README's figures are docs/performance.md's:
// its Performance table is the one under figuresHeading, row for row, and
// every number in any other README table row that gives checks/s or
// pairs/s is a number of that table (so "33.9k" where the table says
// 28,696 fails).
func TestREADMEFigures(t *testing.T) {
	root := filepath.Join("..", "..")
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme, perf := read("README.md"), read(filepath.Join("docs", "performance.md"))
	src, _ := tableAfter(perf, figuresHeading)
	if src == nil {
		t.Fatalf("docs/performance.md: no table under %q", figuresHeading)
	}
	got, at := tableAfter(readme, "## Performance")
	if got == nil {
		t.Fatal("README.md: no table under ## Performance")
	}
	if strings.Join(got, "\n") != strings.Join(src, "\n") {
		t.Errorf("README.md:%d: the Performance table is not docs/performance.md's (under %q): copy it from there\nREADME.md:\n%s\ndocs/performance.md:\n%s",
			at, figuresHeading, strings.Join(got, "\n"), strings.Join(src, "\n"))
	}
	known := map[string]bool{}
	for _, n := range number.FindAllString(strings.Join(src, "\n"), -1) {
		known[n] = true
	}
	checked := 0
	for i, l := range strings.Split(readme, "\n") {
		if i+1 >= at && i+1 < at+len(got) || !strings.HasPrefix(l, "|") || !strings.Contains(l, "checks/s") && !strings.Contains(l, "pairs/s") {
			continue
		}
		checked++
		for _, n := range number.FindAllString(l, -1) {
			if !known[n] {
				t.Errorf("README.md:%d: %s is not a figure of docs/performance.md's table (under %q)", i+1, n, figuresHeading)
			}
		}
	}
	if checked == 0 {
		t.Error("README.md: no table row outside Performance gives checks/s; the test checks nothing there")
	}
}

// number is a figure as the tables write it: digits with thousands' commas
// and decimals, and a unit letter glued to it (33.9k).
var number = regexp.MustCompile(`\d(?:[\d,]*\d)?(?:\.\d+)?[A-Za-z]?`)

// tableAfter returns the lines of the first Markdown table after the line
// heading, and the 1-based line it starts at (nil, 0 if there is none).
func tableAfter(md, heading string) ([]string, int) {
	lines := strings.Split(md, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != heading {
			continue
		}
		for j := i + 1; j < len(lines); j++ {
			if strings.HasPrefix(lines[j], "#") {
				return nil, 0
			}
			if strings.HasPrefix(lines[j], "|") {
				k := j
				for k < len(lines) && strings.HasPrefix(lines[k], "|") {
					k++
				}
				return lines[j:k], j + 1
			}
		}
	}
	return nil, 0
}
