package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// exports is what one package name offers: its exported top-level names
// (with the tests and examples of its test files, which pages cite), and
// for each exported type the exported methods and fields it has.
type exports struct {
	names   map[string]bool
	members map[string]map[string]bool // type -> method or field
}

// readExports parses the non-test Go files of the module under root and
// returns the exports of every package, by package name. Packages that
// share a name are merged; package main and the go-zookeeper copy are left
// out.
func readExports(t *testing.T, root string) map[string]*exports {
	t.Helper()
	pkgs := map[string]*exports{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			// The backend's private go-zookeeper copy: pages that say zk.X
			// mean upstream's package (zk.Lock, the incumbent).
			if filepath.ToSlash(strings.TrimPrefix(path, root)) == "/fencedzookeeper/internal/zk" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		test := strings.HasSuffix(path, "_test.go")
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(f.Name.Name, "_test")
		if name == "main" {
			return nil
		}
		e := pkgs[name]
		if e == nil {
			e = &exports{names: map[string]bool{}, members: map[string]map[string]bool{}}
			pkgs[name] = e
		}
		member := func(typ, name string) {
			if !ast.IsExported(name) {
				return
			}
			if e.members[typ] == nil {
				e.members[typ] = map[string]bool{}
			}
			e.members[typ][name] = true
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if test { // pages cite tests and examples by name
					if decl.Recv == nil && (strings.HasPrefix(decl.Name.Name, "Test") || strings.HasPrefix(decl.Name.Name, "Example")) {
						e.names[decl.Name.Name] = true
					}
					continue
				}
				if decl.Recv == nil {
					e.names[decl.Name.Name] = true
					continue
				}
				recv := decl.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if idx, ok := recv.(*ast.IndexExpr); ok {
					recv = idx.X
				}
				if idx, ok := recv.(*ast.IndexListExpr); ok {
					recv = idx.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					member(id.Name, decl.Name.Name)
				}
			case *ast.GenDecl:
				if test {
					continue
				}
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						e.names[spec.Name.Name] = true
						if e.members[spec.Name.Name] == nil {
							e.members[spec.Name.Name] = map[string]bool{}
						}
						var fields *ast.FieldList
						switch typ := spec.Type.(type) {
						case *ast.StructType:
							fields = typ.Fields
						case *ast.InterfaceType:
							fields = typ.Methods
						}
						if fields == nil {
							continue
						}
						for _, field := range fields.List {
							for _, name := range field.Names {
								member(spec.Name.Name, name.Name)
							}
							if len(field.Names) == 0 { // embedded: its members are promoted
								e.members[spec.Name.Name]["*"] = true
							}
						}
					case *ast.ValueSpec:
						for _, name := range spec.Names {
							e.names[name.Name] = true
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// reference matches a qualified name such as fencedpostgres.DatabaseURL or
// fence.SQLOptions.Hook.
var reference = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// codeSpan matches a Markdown code span or fenced block, where code is named.
var codeSpan = regexp.MustCompile("(?s)```.*?```|`[^`\n]+`")

// TestMarkdownNamesExist reads every Markdown page of the repository and
// checks that each qualified name in its code (pkg.Name or pkg.Type.Member,
// where pkg is one of the module's packages) is exported by that package.
// A page that still names an identifier after a rename fails here.
func TestMarkdownNamesExist(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := readExports(t, root)
	if len(pkgs) < 10 || pkgs["fenced"] == nil || !pkgs["fenced"].names["Open"] {
		t.Fatalf("read the exports of %d packages from %s, without fenced.Open: the walk is broken", len(pkgs), root)
	}
	pages, err := filepath.Glob(filepath.Join(root, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	// CHANGELOG.md is left out: it names what was renamed or removed.
	pages = append(slices.DeleteFunc(pages, func(p string) bool { return filepath.Base(p) == "CHANGELOG.md" }), more...)
	checked := 0
	var bad []string
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, span := range codeSpan.FindAllString(string(text), -1) {
			for _, m := range reference.FindAllStringSubmatch(span, -1) {
				e := pkgs[m[1]]
				if e == nil {
					continue // a standard package, or a variable
				}
				checked++
				switch {
				case !e.names[m[2]]:
					bad = append(bad, rel+": "+m[0]+": "+m[1]+" has no exported "+m[2])
				case m[3] != "" && e.members[m[2]] != nil && !e.members[m[2]][m[3]] && !e.members[m[2]]["*"]:
					bad = append(bad, rel+": "+m[0]+": "+m[1]+"."+m[2]+" has no exported "+m[3])
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d qualified names in %d pages: the scan is broken", checked, len(pages))
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
	t.Logf("checked %d qualified names in %d pages", checked, len(pages))
}
