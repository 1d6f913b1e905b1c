package readme

import (
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestLinks checks every relative link in every Markdown file of the
// repository (git's tracked ones; every *.md under the root outside git): its
// file or folder exists (and is tracked, when git is at hand: GitHub shows
// only those), and its #anchor is a heading of the target, as GitHub makes
// anchors from headings. Links with a scheme (https:, mailto:) are not
// checked: the test needs no network.
func TestLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	repo := newRepoFiles(t, root)
	anchors := map[string]map[string]bool{} // by Markdown file, relative to root
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[rel] = a
		return a
	}
	n := 0
	for _, doc := range repo.markdown() {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range mdLinks(string(b)) {
			target, ok := relativeTarget(l.target)
			if !ok {
				continue
			}
			n++
			where := doc + ":" + strconv.Itoa(l.line) + ": link " + strconv.Quote(l.target)
			file, frag, _ := strings.Cut(target, "#")
			p, err := url.PathUnescape(file)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			rel := doc
			if p != "" {
				if strings.HasPrefix(p, "/") { // GitHub: from the repository's root
					rel = path.Clean(strings.TrimPrefix(p, "/"))
				} else {
					rel = path.Join(path.Dir(doc), p)
				}
				if rel == ".." || strings.HasPrefix(rel, "../") {
					t.Errorf("%s: leads out of the repository", where)
					continue
				}
				if msg := repo.check(rel); msg != "" {
					t.Errorf("%s: %s", where, msg)
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(rel, ".md") {
				continue // anchors in other files (#L12 in a .go file) are GitHub's lines
			}
			if frag, err = url.PathUnescape(frag); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if !anchorsOf(rel)[frag] {
				t.Errorf("%s: no heading in %s has the anchor #%s%s", where, rel, frag, closest(frag, anchorsOf(rel)))
			}
		}
	}
	if n == 0 {
		t.Fatal("no relative links found in the Markdown files")
	}
	t.Logf("%d relative links checked in %d Markdown files", n, len(repo.markdown()))
}

// repoFiles is what the repository holds: git's tracked files, or, outside
// a git work tree, the files on disk.
type repoFiles struct {
	t       *testing.T
	root    string
	tracked map[string]bool // nil outside git
}

func newRepoFiles(t *testing.T, root string) *repoFiles {
	r := &repoFiles{t: t, root: root}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Logf("no git work tree (%v): checking the files on disk", err)
		return r
	}
	r.tracked = map[string]bool{}
	for f := range strings.SplitSeq(string(out), "\x00") {
		if f != "" {
			r.tracked[f] = true
		}
	}
	return r
}

// markdown returns the Markdown files, relative to the root, with slashes.
func (r *repoFiles) markdown() []string {
	var mds []string
	if r.tracked != nil {
		for f := range r.tracked {
			if strings.HasSuffix(f, ".md") {
				if _, err := os.Stat(filepath.Join(r.root, f)); err == nil { // deleted, not yet committed
					mds = append(mds, f)
				}
			}
		}
	} else {
		err := filepath.WalkDir(r.root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && p != r.root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(r.root, p)
				mds = append(mds, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			r.t.Fatal(err)
		}
	}
	slices.Sort(mds)
	if len(mds) == 0 {
		r.t.Fatal("no Markdown files found")
	}
	return mds
}

// check says what is wrong with a link to rel (a file or folder relative to
// the root), or "" if nothing is.
func (r *repoFiles) check(rel string) string {
	rel = strings.TrimSuffix(rel, "/")
	if rel == "." {
		return ""
	}
	fi, err := os.Stat(filepath.Join(r.root, filepath.FromSlash(rel)))
	if err != nil {
		return "no such file or folder: " + rel
	}
	if r.tracked == nil || r.tracked[rel] {
		return ""
	}
	if fi.IsDir() {
		for f := range r.tracked {
			if strings.HasPrefix(f, rel+"/") {
				return ""
			}
		}
	}
	return rel + " is not tracked by git: GitHub would not show it"
}

// relativeTarget returns a link's target if it is relative (a path, or an
// anchor in the same file), not a URL with a scheme or a host.
func relativeTarget(target string) (string, bool) {
	if target == "" || strings.HasPrefix(target, "//") {
		return "", false
	}
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		return "", false
	}
	return target, true
}

type mdLink struct {
	line   int
	target string
}

var (
	// inlineLink is [text](target) and ![alt](target), target optionally in
	// <> and followed by a title.
	inlineLink = regexp.MustCompile(`\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+"[^"]*")?\s*\)`)
	// refDef is a reference definition: [label]: target.
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	// htmlLink is an HTML attribute that links.
	htmlLink  = regexp.MustCompile(`(?i)\b(?:href|src)\s*=\s*"([^"]*)"`)
	codeSpans = regexp.MustCompile("`+[^`]*`+")
)

// mdLinks returns the links of a Markdown text, outside code blocks and
// code spans.
func mdLinks(md string) []mdLink {
	var out []mdLink
	for i, l := range proseLines(md) {
		if l == "" {
			continue
		}
		l = codeSpans.ReplaceAllString(l, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			targets = append(targets, m[1])
		}
		if m := refDef.FindStringSubmatch(l); m != nil {
			targets = append(targets, m[1])
		}
		for _, m := range htmlLink.FindAllStringSubmatch(l, -1) {
			targets = append(targets, m[1])
		}
		for _, tg := range targets {
			out = append(out, mdLink{line: i + 1, target: strings.TrimSuffix(strings.TrimPrefix(tg, "<"), ">")})
		}
	}
	return out
}

// proseLines returns md's lines with those of fenced code blocks (and their
// fences) blanked, so that indexes stay line numbers.
func proseLines(md string) []string {
	lines := strings.Split(md, "\n")
	fence := ""
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$`)
	// explicitAnchor is an HTML element's id or an <a name>.
	explicitAnchor = regexp.MustCompile(`(?i)<[a-z][^>]*\s(?:id|name)\s*=\s*"([^"]+)"`)
	mdImageOrLink  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag        = regexp.MustCompile(`<[^>]+>`)
)

// headingAnchors returns the anchors GitHub gives a Markdown text's
// headings (ATX and setext), and the ids of its HTML elements.
func headingAnchors(md string) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	add := func(text string) {
		s := slug(text)
		if n := seen[s]; n > 0 {
			a[s+"-"+strconv.Itoa(n)] = true
		} else {
			a[s] = true
		}
		seen[s]++
	}
	lines := proseLines(md)
	for i, l := range lines {
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			add(m[1])
		} else if i > 0 && strings.TrimSpace(lines[i-1]) != "" && isSetextUnderline(l) && !atxHeading.MatchString(lines[i-1]) {
			add(strings.TrimSpace(lines[i-1]))
		}
		for _, m := range explicitAnchor.FindAllStringSubmatch(l, -1) {
			a[m[1]] = true
		}
	}
	return a
}

func isSetextUnderline(l string) bool {
	l = strings.TrimSpace(l)
	return l != "" && (strings.Trim(l, "=") == "" || strings.Trim(l, "-") == "" && len(l) >= 2)
}

// slug is GitHub's anchor for a heading (github-slugger): the heading's
// text without its markup, lowercased, with every character but letters,
// digits, '-', '_' and spaces removed, and spaces made '-'.
func slug(heading string) string {
	text := mdImageOrLink.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// closest suggests the anchor nearest to frag, for the message.
func closest(frag string, anchors map[string]bool) string {
	best, bestN := "", 0
	for a := range anchors {
		n := 0
		for n < len(a) && n < len(frag) && a[n] == frag[n] {
			n++
		}
		if n > bestN || n == bestN && n > 0 && a < best {
			best, bestN = a, n
		}
	}
	if bestN < 3 {
		return ""
	}
	return " (did you mean #" + best + "?)"
}

// The checker's own parts, on GitHub's examples.
func TestSlugAndLinks(t *testing.T) {
	for heading, want := range map[string]string{
		"Failure behaviour and timeouts":          "failure-behaviour-and-timeouts",
		"Several limits at once: AllowAll":        "several-limits-at-once-allowall",
		"HTTP, gRPC and Connect":                  "http-grpc-and-connect",
		"Plans (per-key limits)":                  "plans-per-key-limits",
		"`pgratelimit db`: a database for trying": "pgratelimit-db-a-database-for-trying",
		"What's new in [v0.1.0](CHANGELOG.md)?":   "whats-new-in-v010",
		"C++ & Go -- snake_case":                  "c--go----snake_case",
		"Ünïcode façade → done":                   "ünïcode-façade--done",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}

	md := "# Usage\n\ntext\n\n## Usage\n\nSetext\n---\n\n```sh\n# not a heading\n[no](link.md)\n```\n\n" +
		"See [a](docs/a.md#x), `[code](span.md)`, ![img](img.png \"title\") and <a href=\"b.md\">b</a>.\n" +
		"[ref]: <c d.md#usage-1>\n<a id=\"here\"></a>\n"
	a := headingAnchors(md)
	for _, want := range []string{"usage", "usage-1", "setext", "here"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Errorf("a comment in a code block made an anchor: %v", a)
	}
	var got []string
	for _, l := range mdLinks(md) {
		got = append(got, strconv.Itoa(l.line)+" "+l.target)
	}
	want := []string{"15 docs/a.md#x", "15 img.png", "15 b.md", "16 c d.md#usage-1"}
	if !slices.Equal(got, want) {
		t.Errorf("links %q, want %q", got, want)
	}
	for target, relative := range map[string]bool{"#x": true, "../a.md": true, "https://x.org/a.md": false, "mailto:a@b": false, "//x.org": false} {
		if _, ok := relativeTarget(target); ok != relative {
			t.Errorf("relativeTarget(%q) = %v, want %v", target, ok, relative)
		}
	}
}
