package errid

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEverySentinelCrosses: every exported Err* variable of the packages
// whose errors a krcored or remote-device call can return is in the table,
// so that a sentinel added to one of them later cannot silently lose its
// identity on the way to a client (errors.Is answers differently embedded
// and through krcored or the remote device).
func TestEverySentinelCrosses(t *testing.T) {
	known := make(map[string]bool, len(sentinels))
	for _, s := range sentinels {
		known[s.name] = true
	}
	for pkg, dir := range map[string]string{"krcore": ".", "verbs": "verbs", "meta": "meta", "offheap": "offheap",
		"udrpc": "internal/udrpc"} {
		for name, alias := range exportedErrs(t, filepath.Join("..", "..", dir)) {
			if alias == "" {
				alias = pkg + "." + name
			}
			if !known[alias] {
				t.Errorf("%s.%s does not keep its identity across a process: add it to sentinels", pkg, name)
			}
		}
	}
}

// exportedErrs lists the exported package-level variables named Err* that
// dir's non-test files declare, each with the sentinel it is another name
// for ("verbs.ErrInvalid" for `ErrInvalid = verbs.ErrInvalid`), or "".
func exportedErrs(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	names := make(map[string]string)
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
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !id.IsExported() || !strings.HasPrefix(id.Name, "Err") {
						continue
					}
					names[id.Name] = ""
					if i < len(vs.Values) {
						if sel, ok := vs.Values[i].(*ast.SelectorExpr); ok {
							if x, ok := sel.X.(*ast.Ident); ok {
								names[id.Name] = x.Name + "." + sel.Sel.Name
							}
						}
					}
				}
			}
		}
	}
	return names
}
