// Command shape measures two things about the tree's shape: how many
// items each public package exports, and which folder-level imports
// run upward (take part in a cycle between folders).
//
//	go run ./scripts/shape            # both reports
//	go run ./scripts/shape -api . ./driver ./recipe
//	go run ./scripts/shape -imports   # upward imports only
//	go run ./scripts/shape -style     # comment and message lengths
//	go run ./scripts/shape -style ./httpapi ./internal
//
// Exported items are counted as docs/design.md counts the root, in
// non-test files: exported top-level names (constants, variables, types,
// functions), exported methods of exported types and the methods of
// exported interfaces, and exported fields of exported struct types (an
// embedded field by its type's name).
//
// The style report reads every non-test Go file of the module but the
// go-zookeeper copy (kept in upstream's style): the words per sentence of
// doc comments on exported names, lines over 140 columns, and error
// strings (errors.New, fmt.Errorf) over 120 characters; literals joined
// by + count as one string. A sentence ends at ". ", "? " or "! ", or at
// the comment's end; code lines (indented by a tab) are not counted.
// Folders named after -style limit the report to them (a nested module
// named there is read too).
//
// For imports, each package of the module is placed in a folder: its
// first path element, or its first two under internal/ (whose folders
// are separate tiers). An import from one folder to another runs upward
// when the second folder also reaches the first through imports.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	api := flag.Bool("api", false, "count the exported items of the packages named (default: root, driver, recipe)")
	imports := flag.Bool("imports", false, "list the folder-level imports that run upward")
	style := flag.Bool("style", false, "measure doc sentences, long lines and long error strings")
	flag.Parse()
	all := !*api && !*imports && !*style
	if *api || all {
		dirs := flag.Args()
		if len(dirs) == 0 {
			dirs = []string{".", "./driver", "./recipe"}
		}
		if err := reportAPI(dirs); err != nil {
			fmt.Fprintln(os.Stderr, "shape:", err)
			os.Exit(1)
		}
	}
	if *imports || all {
		if err := reportImports(); err != nil {
			fmt.Fprintln(os.Stderr, "shape:", err)
			os.Exit(1)
		}
	}
	if *style || all {
		var roots []string
		if !*api {
			roots = flag.Args()
		}
		if err := reportStyle(roots); err != nil {
			fmt.Fprintln(os.Stderr, "shape:", err)
			os.Exit(1)
		}
	}
}

// apiCount is one package's exported items, by kind.
type apiCount struct{ names, methods, fields int }

func (c apiCount) total() int { return c.names + c.methods + c.fields }

func reportAPI(dirs []string) error {
	fmt.Printf("%-12s %6s %8s %7s %6s\n", "package", "names", "methods", "fields", "total")
	var sum apiCount
	for _, dir := range dirs {
		c, err := countAPI(dir)
		if err != nil {
			return err
		}
		sum.names += c.names
		sum.methods += c.methods
		sum.fields += c.fields
		fmt.Printf("%-12s %6d %8d %7d %6d\n", dir, c.names, c.methods, c.fields, c.total())
	}
	fmt.Printf("%-12s %6d %8d %7d %6d\n", "all", sum.names, sum.methods, sum.fields, sum.total())
	return nil
}

func countAPI(dir string) (apiCount, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return apiCount{}, err
	}
	var c apiCount
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly)
		if err != nil {
			return apiCount{}, err
		}
		if f.Name.Name == "main" {
			continue
		}
		if f, err = parser.ParseFile(fset, path, nil, 0); err != nil {
			return apiCount{}, err
		}
		countFile(f, &c)
	}
	return c, nil
}

func countFile(f *ast.File, c *apiCount) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				c.names++
			} else if ast.IsExported(receiverType(d.Recv.List[0].Type)) {
				c.methods++
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							c.names++
						}
					}
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					c.names++
					countType(s.Type, c)
				}
			}
		}
	}
}

func countType(t ast.Expr, c *apiCount) {
	switch t := t.(type) {
	case *ast.StructType:
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				if ast.IsExported(receiverType(f.Type)) {
					c.fields++
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					c.fields++
				}
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			for _, n := range m.Names {
				if n.IsExported() {
					c.methods++
				}
			}
		}
	}
}

// receiverType names the type of a receiver or an embedded field.
func receiverType(t ast.Expr) string {
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.SelectorExpr:
			return x.Sel.Name
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// listed is the part of go list's JSON that the import report reads.
type listed struct {
	ImportPath string
	Module     *struct{ Path string }
	Imports    []string
}

func reportImports() error {
	out, err := exec.Command("go", "list", "-json=ImportPath,Module,Imports", "./...").Output()
	if err != nil {
		return fmt.Errorf("go list: %w", err)
	}
	edges := map[string]map[string]bool{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			return err
		}
		if p.Module == nil {
			continue
		}
		mod := p.Module.Path
		from := folder(mod, p.ImportPath)
		for _, imp := range p.Imports {
			if imp != mod && !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			to := folder(mod, imp)
			if to == from {
				continue
			}
			if edges[from] == nil {
				edges[from] = map[string]bool{}
			}
			edges[from][to] = true
		}
	}
	var all, upward []string
	for from, tos := range edges {
		for to := range tos {
			e := from + " -> " + to
			all = append(all, e)
			if reaches(edges, to, from) {
				upward = append(upward, e)
			}
		}
	}
	sort.Strings(upward)
	for _, e := range upward {
		fmt.Println("upward:", e)
	}
	fmt.Printf("%d of %d folder-level imports run upward\n", len(upward), len(all))
	return nil
}

// folder places a package in its folder for the import report.
func folder(mod, path string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(path, mod), "/")
	if rel == "" {
		return "(root)"
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if parts[0] == "internal" && len(parts) > 1 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}

func reaches(edges map[string]map[string]bool, from, to string) bool {
	seen := map[string]bool{from: true}
	stack := []string{from}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if n == to {
			return true
		}
		for m := range edges[n] {
			if !seen[m] {
				seen[m] = true
				stack = append(stack, m)
			}
		}
	}
	return false
}
