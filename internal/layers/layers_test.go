// Package layers checks the library's layering and the rules of its code
// that the compiler does not: which internal package may import which, no
// package-level mutable state, short functions, every exported name
// documented.
package layers

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/pgratelimit/pgratelimit"

// allowed lists, for each package of the library, the packages of the
// project it may import (directly or not): a check goes downwards only, API,
// coalescer, engine, statements, account.
var allowed = map[string][]string{
	"internal/account":  {},
	"internal/sqlgen":   {},
	"internal/engine":   {"internal/account", "internal/sqlgen"},
	"internal/coalesce": {"internal/engine", "internal/account", "internal/sqlgen"},
	"internal/citus":    {"internal/engine", "internal/account", "internal/sqlgen"},
	"internal/cleanup":  {"internal/citus", "internal/engine", "internal/account", "internal/sqlgen"},
	"internal/lease":    {"internal/engine", "internal/account", "internal/sqlgen"},
	"internal/alert":    {"internal/engine", "internal/notify", "internal/account", "internal/sqlgen"},
	"internal/notify":   {"internal/sqlgen"},
	// Above the root API (see imports): whatever the root imports.
	"internal/middleware":                {"pgratelimit", "internal/*", "migrations"},
	"internal/middleware/middlewaretest": {"pgratelimit", "internal/*", "migrations"},
	// The API packages: the root orchestrates the internal packages; the
	// events package (the consumer and listing of usage alert events) sits
	// beside it and uses its errors, over internal/alert's delivery.
	"pgratelimit":        {"internal/*"},
	"pgratelimit/events": {"pgratelimit", "internal/*"},
	// Above them: the operator's reads (admin) and the operator UI, which
	// acts through the API; nothing of the library imports them.
	"pgratelimit/admin": {"pgratelimit", "internal/*"},
	"pgratelimit/ui":    {"pgratelimit", "pgratelimit/admin", "pgratelimit/events", "internal/*"},
}

// imports lists, for the packages that import the root API, the packages
// of the project they may import directly. The middleware core is the one
// internal package that imports the root: it charges requests with
// pgratelimit.AllowAll, so that an adapter answers exactly what a caller of
// the library would get, and it reaches no account internals (what it
// knows of a check, such as a limiter's window, comes through the root's
// API). Its conformance suite adds the test databases. The events package
// validates, converts and wires: the delivery (claiming, the loop, retries,
// LISTEN, the SQL and its rows) is internal/alert's, so it imports no
// statements nor notify itself, only engine's checks of text and errors.
var imports = map[string][]string{
	"internal/middleware":                {"pgratelimit"},
	"internal/middleware/middlewaretest": {"pgratelimit", "internal/testdb"},
	"pgratelimit/events":                 {"pgratelimit", "internal/alert", "internal/engine"},
}

// adapters are the middleware packages, of three modules: none imports
// another (what they share is internal/middleware).
var adapters = []string{"pgratelimit/httplimit", "grpclimit", "connectlimit"}

type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Dir        string
	GoFiles    []string
}

// packages lists the library module's packages with their dependencies.
func packages(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", mod+"/...")
	cmd.Env = append(cmd.Environ(), "GOWORK=off") // the library's module alone
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	if _, err := os.Stat(filepath.Join("..", "..", pkg)); os.IsNotExist(err) {
		return nil // not there (yet)
	}
	cmd := exec.Command("go", "list", "-deps", mod+"/"+pkg)
	cmd.Env = append(cmd.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var own []string
	for _, d := range strings.Fields(string(out)) {
		if rel, ok := strings.CutPrefix(d, mod+"/"); ok && rel != pkg {
			own = append(own, rel)
		}
	}
	return own
}

// TestLayers checks the imports of every internal package against allowed
// and imports: account and sqlgen import nothing of the project, citus does
// not import coalesce, nothing internal imports the root API but the
// middleware core, which imports nothing internal; internal/alert (the
// events' delivery) imports neither API package, and the events package
// reaches the delivery only through it.
func TestLayers(t *testing.T) {
	for pkg, may := range allowed {
		for _, d := range deps(t, pkg) {
			if !slices.ContainsFunc(may, func(m string) bool {
				return m == d || strings.HasSuffix(m, "/*") && strings.HasPrefix(d, strings.TrimSuffix(m, "*"))
			}) {
				t.Errorf("%s imports %s", pkg, d)
			}
		}
	}
	for _, p := range packages(t) {
		rel := strings.TrimPrefix(p.ImportPath, mod+"/")
		if may, ok := imports[rel]; ok {
			for _, d := range p.Imports {
				if d, own := strings.CutPrefix(d, mod+"/"); own && !slices.Contains(may, d) {
					t.Errorf("%s imports %s", rel, d)
				}
			}
		}
		if strings.HasPrefix(rel, "internal/") && !strings.HasPrefix(rel, "internal/testdb") && !strings.HasPrefix(rel, "internal/pglaunch") &&
			!strings.HasPrefix(rel, "internal/readme") && rel != "internal/layers" {
			if _, ok := allowed[rel]; !ok {
				t.Errorf("%s has no layering rule here", rel)
			}
		}
	}
}

// TestAdaptersApart: no adapter imports another, in the workspace that
// ties their modules together.
func TestAdaptersApart(t *testing.T) {
	work, err := filepath.Abs(filepath.Join("..", "..", "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range adapters {
		cmd := exec.Command("go", "list", "-deps", mod+"/"+a)
		cmd.Env = append(cmd.Environ(), "GOWORK="+work)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", a, err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, mod+"/internal/middleware") {
			t.Errorf("%s does not import internal/middleware: is the list of adapters right?", a)
		}
		for _, other := range adapters {
			if other != a && slices.Contains(deps, mod+"/"+other) {
				t.Errorf("%s imports %s", a, other)
			}
		}
	}
}

// library is every non-test Go file of the library's own packages (not the
// test harnesses).
func library(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	files := map[string]*ast.File{}
	fset := token.NewFileSet()
	for _, p := range packages(t) {
		rel := strings.TrimPrefix(p.ImportPath, mod+"/")
		if strings.HasPrefix(rel, "internal/testdb") || strings.HasPrefix(rel, "internal/pglaunch") || strings.HasPrefix(rel, "internal/readme") {
			continue
		}
		for _, f := range p.GoFiles {
			path := filepath.Join(p.Dir, f)
			af, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files[rel+"/"+f] = af
		}
	}
	return fset, files
}

// constants are the package-level variables that are constants Go cannot
// declare as such.
var constants = map[string]string{
	"internal/account/sat.go MaxTime": "a time.Time",
}

// TestNoMutableState: package-level variables are sentinel errors, SQL text
// (sqlgen), embedded files and the constants above only.
func TestNoMutableState(t *testing.T) {
	_, files := library(t)
	for name, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					switch {
					case n.Name == "_", strings.HasPrefix(n.Name, "Err"), strings.HasPrefix(n.Name, "err"),
						strings.HasPrefix(name, "internal/sqlgen/"), embedded(g),
						strings.Contains(name, "migrations/") && n.Name == "FS", constants[name+" "+n.Name] != "":
					default:
						t.Errorf("%s: package-level variable %s", name, n.Name)
					}
				}
			}
		}
	}
}

// TestShortFunctions: no function of the library over 80 lines.
func TestShortFunctions(t *testing.T) {
	fset, files := library(t)
	for name, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Pos()).Line
			if lines > 80 {
				t.Errorf("%s: %s is %d lines", name, fn.Name.Name, lines)
			}
		}
	}
}

// TestExportedDocumented: every exported name of the library has a doc
// comment.
func TestExportedDocumented(t *testing.T) {
	_, files := library(t)
	for name, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && d.Doc == nil && exportedRecv(d) {
					t.Errorf("%s: %s has no doc comment", name, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					checkSpec(t, name, d, s)
				}
			}
		}
	}
}

// embedded says whether a declaration is of embedded files: a //go:embed
// directive (which CommentGroup.Text leaves out) in its doc.
func embedded(g *ast.GenDecl) bool {
	return g.Doc != nil && slices.ContainsFunc(g.Doc.List, func(c *ast.Comment) bool { return strings.HasPrefix(c.Text, "//go:embed ") })
}

func checkSpec(t *testing.T, name string, d *ast.GenDecl, s ast.Spec) {
	t.Helper()
	switch s := s.(type) {
	case *ast.TypeSpec:
		if s.Name.IsExported() && d.Doc == nil && s.Doc == nil {
			t.Errorf("%s: type %s has no doc comment", name, s.Name.Name)
		}
	case *ast.ValueSpec:
		for _, n := range s.Names {
			if n.IsExported() && d.Doc == nil && s.Doc == nil && s.Comment == nil {
				t.Errorf("%s: %s has no doc comment", name, n.Name)
			}
		}
	}
}

// exportedRecv says whether a method's receiver type is exported (or it is
// a function).
func exportedRecv(fn *ast.FuncDecl) bool {
	if fn.Recv == nil {
		return true
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
