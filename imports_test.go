package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is this module's path, the prefix of every package of ours.
const module = "breakwater"

// modulePackages reads the non-test imports of every package of the
// module from its source files, by import path, without the go command.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	err := filepath.WalkDir(".", func(dir string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); dir != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(dir, 0)
		var none *build.NoGoError
		if errors.As(err, &none) {
			return nil
		}
		if err != nil {
			return err
		}
		path := module
		if dir != "." {
			path += "/" + filepath.ToSlash(dir)
		}
		pkgs[path] = p.Imports // Imports leaves out the test files' imports
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// httpEdge are the packages of the HTTP edge, the only ones but the
// wiring that know Echo: the transport both listeners share, the public
// and the admin API built on it, and the helpers their tests share.
var httpEdge = []string{"breakwater/server/edge", "breakwater/server/api", "breakwater/server/admin", "breakwater/server/edgetest"}

// isHTTPEdge reports whether pkg is one of httpEdge.
func isHTTPEdge(pkg string) bool { return slices.Contains(httpEdge, pkg) }

// wiring reports whether pkg is one of the packages that put the service
// together (the App and the command line), which may import anything.
func wiring(pkg string) bool {
	return within(pkg, "breakwater/server/app") || within(pkg, "breakwater/server/cli")
}

// within reports whether path is pkg or one of its subpackages.
func within(path, pkg string) bool {
	return path == pkg || strings.HasPrefix(path, pkg+"/")
}

// TestLayerPackagesImportNeitherStorageNorServer keeps the dependencies
// pointing inward: the packages that decide (limiter, budget, detect, the
// guard with its state and replay) and the upstream client (ocr) know
// neither the database nor the transport nor Echo, even through another
// package of ours; nothing under detect depends on budget; no package
// under server/ imports a package it lies under, and server/ itself
// holds only its doc.go; the HTTP edge's transport (server/edge) knows
// neither the public API (server/api) nor the admin API (server/admin),
// and those two do not know each other; only the HTTP edge (those three
// and the wiring) and main import Echo; only storage imports bbolt; the owners of the
// records (server/keys, server/invites) and the HTTP edge know neither
// storage nor bbolt. Test files are left out: a test may open a real database.
func TestLayerPackagesImportNeitherStorageNorServer(t *testing.T) {
	if _, err := os.Stat("go.mod"); err != nil {
		t.Fatalf("the test runs from the module's root: %v", err)
	}
	pkgs := modulePackages(t)
	for _, pkg := range []string{"breakwater", "breakwater/budget", "breakwater/detect", "breakwater/limiter", "breakwater/ocr", "breakwater/server", "breakwater/server/api", "breakwater/server/admin", "breakwater/server/edge", "breakwater/server/guard/state", "breakwater/server/guard",
		"breakwater/server/guard/replay", "breakwater/detect/smtptest", "breakwater/server/invites", "breakwater/server/jwtauth", "breakwater/server/keys", "breakwater/server/operator", "breakwater/storage"} {
		if _, ok := pkgs[pkg]; !ok {
			t.Fatalf("package %s not found among %d packages read", pkg, len(pkgs))
		}
	}
	checkDecidersKnowNeitherStorageNorHTTP(t, pkgs)
	checkRecordOwnersKnowNoStorage(t, pkgs)
	t.Run("detect without budget", func(t *testing.T) { checkDetectWithoutBudget(t, pkgs) })
	t.Run("server root", func(t *testing.T) { checkServerRootIsAMap(t, pkgs) })
	t.Run("server subpackages", func(t *testing.T) { checkServerPartsKnowNoEdge(t, pkgs) })
	t.Run("the HTTP edge by audience", func(t *testing.T) { checkEdgeSplitByAudience(t, pkgs) })
	t.Run("no package under server imports its parent", func(t *testing.T) { checkNoServerPackageImportsItsParent(t, pkgs) })
	t.Run("backendtest only in tests", func(t *testing.T) { checkBackendSuiteOnlyInTests(t, pkgs) })
	checkLibrariesStayInTheirPackage(t, pkgs)
}

// moduleDeps returns every package of the module that pkg depends on,
// directly or not, with the chain of imports that leads to it.
func moduleDeps(pkgs map[string][]string, pkg string) map[string][]string {
	chains := map[string][]string{}
	var walk func(from string, chain []string)
	walk = func(from string, chain []string) {
		for _, imp := range pkgs[from] {
			if !within(imp, module) {
				continue
			}
			if _, seen := chains[imp]; seen {
				continue
			}
			chains[imp] = append(slices.Clone(chain), imp)
			walk(imp, chains[imp])
		}
	}
	walk(pkg, []string{pkg})
	return chains
}

// checkDecidersKnowNeitherStorageNorHTTP: the packages that decide, and
// the guard's state and replay, know neither storage nor the transport
// nor Echo, even through another package of ours; the guard's own
// subpackages may use the guard.
func checkDecidersKnowNeitherStorageNorHTTP(t *testing.T, pkgs map[string][]string) {
	for _, pkg := range []string{"breakwater/budget", "breakwater/detect", "breakwater/limiter", "breakwater/ocr", "breakwater/server/guard", "breakwater/server/guard/replay", "breakwater/server/guard/state"} {
		t.Run(pkg, func(t *testing.T) {
			chains := moduleDeps(pkgs, pkg)
			chains[pkg] = []string{pkg}
			for _, dep := range slices.Sorted(maps.Keys(chains)) {
				if within(dep, "breakwater/storage") || (within(dep, "breakwater/server") && !within(dep, "breakwater/server/guard")) {
					t.Errorf("%s depends on %s: %s", pkg, dep, strings.Join(chains[dep], " -> "))
				}
				if i := slices.IndexFunc(pkgs[dep], func(imp string) bool { return within(imp, "github.com/labstack/echo") }); i >= 0 {
					t.Errorf("%s depends on %s: %s -> %s", pkg, pkgs[dep][i], strings.Join(chains[dep], " -> "), pkgs[dep][i])
				}
			}
		})
	}
}

// checkRecordOwnersKnowNoStorage: the owners of the records the edge and
// the command line use (keys and users, invites and their outcomes, and
// each one's not-found) declare them with the interfaces a backend
// implements, so neither they nor the HTTP edge know the database, even
// through another package of ours: a second backend stands in for bolt
// in the wiring alone.
func checkRecordOwnersKnowNoStorage(t *testing.T, pkgs map[string][]string) {
	for _, pkg := range append([]string{"breakwater/server/keys", "breakwater/server/invites"}, httpEdge...) {
		t.Run(pkg+" without storage", func(t *testing.T) {
			chains := moduleDeps(pkgs, pkg)
			chains[pkg] = []string{pkg}
			for _, dep := range slices.Sorted(maps.Keys(chains)) {
				if within(dep, "breakwater/storage") {
					t.Errorf("%s depends on %s: %s", pkg, dep, strings.Join(chains[dep], " -> "))
				}
				if i := slices.IndexFunc(pkgs[dep], func(imp string) bool { return within(imp, "go.etcd.io/bbolt") }); i >= 0 {
					t.Errorf("%s depends on %s: %s -> %s", pkg, pkgs[dep][i], strings.Join(chains[dep], " -> "), pkgs[dep][i])
				}
			}
		})
	}
}

// checkDetectWithoutBudget: detection reads only its own statistics,
// never billing code: nothing under detect depends on budget (replay,
// which runs the budget's layers, lives with the guard).
func checkDetectWithoutBudget(t *testing.T, pkgs map[string][]string) {
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		if !within(pkg, "breakwater/detect") {
			continue
		}
		if chain, ok := moduleDeps(pkgs, pkg)["breakwater/budget"]; ok {
			t.Errorf("%s depends on breakwater/budget: %s", pkg, strings.Join(chain, " -> "))
		}
	}
}

// checkServerRootIsAMap: server/ is a map, not a package of code: its
// root holds only doc.go, which imports nothing.
func checkServerRootIsAMap(t *testing.T, pkgs map[string][]string) {
	entries, err := os.ReadDir("server")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") && e.Name() != "doc.go" {
			t.Errorf("server/%s: server/ holds only doc.go; code goes into a package under it (the HTTP edge into server/edge, server/api, server/admin)", e.Name())
		}
	}
	if imps := pkgs["breakwater/server"]; len(imps) > 0 {
		t.Errorf("breakwater/server imports %v: its doc.go only maps the packages under it", imps)
	}
}

// checkServerPartsKnowNoEdge: the parts of server/ (keys, JWTs, invites,
// the operator service, the guard and its state) do not know the HTTP
// edge, even through another package of ours; only the wiring puts them
// together with it.
func checkServerPartsKnowNoEdge(t *testing.T, pkgs map[string][]string) {
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		if !within(pkg, "breakwater/server") || isHTTPEdge(pkg) || wiring(pkg) {
			continue
		}
		deps := moduleDeps(pkgs, pkg)
		for _, edge := range httpEdge {
			if chain, ok := deps[edge]; ok {
				t.Errorf("%s depends on %s: %s", pkg, edge, strings.Join(chain, " -> "))
			}
		}
	}
}

// checkEdgeSplitByAudience: the HTTP edge is split by audience, its
// imports pointing one way: the public API (server/api) and the admin API
// (server/admin) each build on the transport (server/edge), which knows
// neither, and neither knows the other; the wiring puts the three
// together.
func checkEdgeSplitByAudience(t *testing.T, pkgs map[string][]string) {
	for _, rule := range []struct{ pkg, not string }{
		{"breakwater/server/edge", "breakwater/server/api"},
		{"breakwater/server/edge", "breakwater/server/admin"},
		{"breakwater/server/api", "breakwater/server/admin"},
		{"breakwater/server/admin", "breakwater/server/api"},
		{"breakwater/server/edgetest", "breakwater/server/api"},
		{"breakwater/server/edgetest", "breakwater/server/admin"},
	} {
		if chain, ok := moduleDeps(pkgs, rule.pkg)[rule.not]; ok {
			t.Errorf("%s depends on %s: %s", rule.pkg, rule.not, strings.Join(chain, " -> "))
		}
	}
	for _, pkg := range []string{"breakwater/server/api", "breakwater/server/admin"} {
		if !slices.Contains(pkgs[pkg], "breakwater/server/edge") {
			t.Errorf("%s does not import breakwater/server/edge: the imports were not read", pkg)
		}
	}
}

// checkNoServerPackageImportsItsParent: arrows point down: no package
// under server/ imports a package it lies under (server/guard/state
// declares the layer methods it holds rather than importing the guard).
func checkNoServerPackageImportsItsParent(t *testing.T, pkgs map[string][]string) {
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		if !within(pkg, "breakwater/server") {
			continue
		}
		for _, imp := range pkgs[pkg] {
			if imp != pkg && within(pkg, imp) {
				t.Errorf("%s imports its parent %s", pkg, imp)
			}
		}
	}
}

// backendSuite is the behaviour suite both storage backends' tests run.
const backendSuite = "breakwater/storage/backendtest"

// checkBackendSuiteOnlyInTests: the storage backends' common suite
// imports testing, so only test files import it (a binary would carry
// the test flags); and it knows no backend, so that each backend's tests,
// bolt's in package storage itself, can run it without a cycle.
func checkBackendSuiteOnlyInTests(t *testing.T, pkgs map[string][]string) {
	if _, ok := pkgs[backendSuite]; !ok {
		t.Fatalf("package %s not found", backendSuite)
	}
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		if slices.Contains(pkgs[pkg], backendSuite) {
			t.Errorf("%s imports %s outside its tests", pkg, backendSuite)
		}
	}
	for dep, chain := range moduleDeps(pkgs, backendSuite) {
		if within(dep, "breakwater/storage") {
			t.Errorf("%s depends on a backend: %s", backendSuite, strings.Join(chain, " -> "))
		}
	}
}

// libraryRules says which packages of ours may import each library that
// must stay inside one package: the transport and the database.
var libraryRules = []struct {
	name    string
	lib     string                // an imported library and its subpackages
	allowed func(pkg string) bool // the packages of ours that may import it
	needed  string                // one that does: the check reads real imports
}{
	{"echo", "github.com/labstack/echo/v4", func(pkg string) bool {
		// bench/load runs a bare Echo handler as the baseline it
		// measures against; it is a tool, not part of the service.
		return pkg == module || isHTTPEdge(pkg) || wiring(pkg) || pkg == "breakwater/bench/load"
	}, "breakwater/server/edge"},
	{"bbolt", "go.etcd.io/bbolt", func(pkg string) bool { return pkg == "breakwater/storage" }, "breakwater/storage"},
	// Google's credentials are the BigQuery client's alone.
	{"oauth2", "golang.org/x/oauth2", func(pkg string) bool { return pkg == "breakwater/budget/reconcile/bigquery" }, "breakwater/budget/reconcile/bigquery"},
}

// checkLibrariesStayInTheirPackage: the transport and the database each
// stay inside their package.
func checkLibrariesStayInTheirPackage(t *testing.T, pkgs map[string][]string) {
	for _, tt := range libraryRules {
		t.Run(tt.name, func(t *testing.T) {
			if !slices.ContainsFunc(pkgs[tt.needed], func(imp string) bool { return within(imp, tt.lib) }) {
				t.Fatalf("%s does not import %s: the imports were not read", tt.needed, tt.lib)
			}
			for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
				for _, imp := range pkgs[pkg] {
					if within(imp, tt.lib) && !tt.allowed(pkg) {
						t.Errorf("%s imports %s", pkg, imp)
					}
				}
			}
		})
	}
}

// importKind orders the groups of an import block: the standard library,
// then other modules, then this module's own packages last, as
// goimports -local breakwater writes them.
func importKind(path string) int {
	switch {
	case within(path, module):
		return 2
	case !strings.Contains(strings.SplitN(path, "/", 2)[0], "."):
		return 0
	default:
		return 1
	}
}

// TestImportsGrouped keeps every Go file's imports as goimports -local
// breakwater groups them: the standard library, other modules, then this
// module's own packages, each group separated from the next by a blank
// line, none split in two and none mixed. It reads the files itself, so
// CI needs no tool for it.
func TestImportsGrouped(t *testing.T) {
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		lines := strings.Split(string(src), "\n")
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.IMPORT {
				continue
			}
			var groups [][]string // the paths of each group, in order
			prevEnd := 0
			for i, spec := range gen.Specs {
				imp := spec.(*ast.ImportSpec)
				p, _ := strconv.Unquote(imp.Path.Value)
				start := fset.Position(spec.Pos()).Line
				if imp.Doc != nil {
					start = fset.Position(imp.Doc.Pos()).Line
				}
				blank := false
				for l := prevEnd + 1; i > 0 && l < start; l++ {
					blank = blank || strings.TrimSpace(lines[l-1]) == ""
				}
				if i == 0 || blank {
					groups = append(groups, nil)
				}
				groups[len(groups)-1] = append(groups[len(groups)-1], p)
				prevEnd = fset.Position(spec.End()).Line
			}
			last := -1
			for _, g := range groups {
				kind := importKind(g[0])
				for _, p := range g[1:] {
					if importKind(p) != kind {
						t.Errorf("%s: %q and %q share a group of imports (goimports -local %s)", path, g[0], p, module)
						break
					}
				}
				if kind <= last {
					t.Errorf("%s: the group of %q comes after a group of its kind or a later one: standard library, other modules, then %s's own (goimports -local %s)", path, g[0], module, module)
				}
				last = max(last, kind)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d Go files read", files)
	}
}

// maxFuncLines is the most lines a function may span, from func to its
// closing brace, tests included.
const maxFuncLines = 100

// longFunctions returns, for each function of f declared over more than
// maxFuncLines lines (and each function literal outside a function,
// such as one a package variable holds), where it starts, its name and
// its length.
func longFunctions(fset *token.FileSet, f *ast.File) []string {
	var long []string
	report := func(node ast.Node, name string) {
		start, end := fset.Position(node.Pos()), fset.Position(node.End())
		if n := end.Line - start.Line + 1; n > maxFuncLines {
			long = append(long, fmt.Sprintf("%s:%d: %s is %d lines", start.Filename, start.Line, name, n))
		}
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Body == nil {
				continue
			}
			name := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) == 1 {
				name = "(" + types.ExprString(d.Recv.List[0].Type) + ")." + name
			}
			report(d, name)
		case *ast.GenDecl:
			ast.Inspect(d, func(n ast.Node) bool {
				if lit, ok := n.(*ast.FuncLit); ok {
					report(lit, "a function literal")
					return false
				}
				return true
			})
		}
	}
	return long
}

// TestNoFunctionOver100Lines keeps every function of the module, tests
// included, within maxFuncLines lines: a longer one is split into named
// parts (a table into a package variable, setup into a helper, phases
// into checks named for what they check). It reads every .go file
// outside testdata and dot-folders.
func TestNoFunctionOver100Lines(t *testing.T) {
	files := 0
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, l := range longFunctions(fset, f) {
			t.Errorf("%s; at most %d: split it into named parts", l, maxFuncLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d Go files read", files)
	}
}

// TestLongFunctionsCountsLines checks the measure TestNoFunctionOver100Lines
// applies: a function of maxFuncLines lines passes, one line more does
// not, for a function, a method and a package variable's function
// literal alike.
func TestLongFunctionsCountsLines(t *testing.T) {
	body := func(lines int) string { // a body spanning lines lines, braces included
		return "{\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n"
	}
	src := "package p\n\ntype T struct{}\n\n" +
		"func fits() " + body(maxFuncLines) + "\n" +
		"func tooLong() " + body(maxFuncLines+1) + "\n" +
		"func (*T) method() " + body(maxFuncLines+1) + "\n" +
		"var v = func() " + body(maxFuncLines+1) + "\n" +
		"var w = func() " + body(maxFuncLines) + "\n" +
		"func outer() {\n\t_ = func() " + body(maxFuncLines-2) + "}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(longFunctions(fset, f), "\n")
	// fits starts on line 5; each declaration is followed by a blank line.
	tooLong := 5 + maxFuncLines + 1
	method := tooLong + maxFuncLines + 2
	v := method + maxFuncLines + 2
	want := strings.Join([]string{
		fmt.Sprintf("p.go:%d: tooLong is %d lines", tooLong, maxFuncLines+1),
		fmt.Sprintf("p.go:%d: (*T).method is %d lines", method, maxFuncLines+1),
		fmt.Sprintf("p.go:%d: a function literal is %d lines", v, maxFuncLines+1),
	}, "\n")
	if got != want {
		t.Errorf("long functions:\n%s\nwant:\n%s", got, want)
	}
}
