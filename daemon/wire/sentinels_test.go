package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEverySentinelCrosses: every exported Err* variable of the packages
// whose errors a daemon call can return is in the table, so that a
// sentinel added to one of them later cannot silently lose its identity
// on the way to a client (errors.Is answers differently embedded and
// through krcored).
func TestEverySentinelCrosses(t *testing.T) {
	known := make(map[string]bool, len(sentinels))
	for _, s := range sentinels {
		known[s.name] = true
	}
	for pkg, dir := range map[string]string{"core": "core", "verbs": "verbs", "meta": "meta", "offheap": "offheap",
		"udrpc": "internal/udrpc"} {
		for _, name := range exportedErrs(t, filepath.Join("..", "..", dir)) {
			if !known[pkg+"."+name] {
				t.Errorf("%s.%s does not cross the socket: add it to sentinels", pkg, name)
			}
		}
	}
}

// exportedErrs lists the exported package-level variables named Err* that
// dir's non-test files declare.
func exportedErrs(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	var names []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if id.IsExported() && strings.HasPrefix(id.Name, "Err") {
						names = append(names, id.Name)
					}
				}
			}
		}
	}
	return names
}
