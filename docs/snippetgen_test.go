package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// renderChunks writes chunks with a //line directive before each, so compiler
// errors name the page and its line.
func renderChunks(b *strings.Builder, page string, chunks []chunk) {
	for _, c := range chunks {
		fmt.Fprintf(b, "//line %s:%d:1\n", page, c.line)
		for _, l := range c.lines {
			b.WriteString(l + "\n")
		}
	}
}

// stdImports maps the package names the pages use, other than the module's
// own, to their import paths: the standard library and the clients and
// frameworks the adapters plug into (all required by go.mod, or, for
// client-go, by fencedk8s/go.mod).
var stdImports = map[string]string{
	"bytes":          "bytes",
	"context":        "context",
	"errors":         "errors",
	"exec":           "os/exec",
	"fmt":            "fmt",
	"http":           "net/http",
	"io":             "io",
	"json":           "encoding/json",
	"log":            "log",
	"os":             "os",
	"signal":         "os/signal",
	"slog":           "log/slog",
	"sql":            "database/sql",
	"strconv":        "strconv",
	"strings":        "strings",
	"sync":           "sync",
	"syscall":        "syscall",
	"time":           "time",
	"clientv3":       "go.etcd.io/etcd/client/v3",
	"cron":           "github.com/robfig/cron/v3",
	"gocron":         "github.com/go-co-op/gocron/v2",
	"leaderelection": "k8s.io/client-go/tools/leaderelection",
	"otel":           "go.opentelemetry.io/otel",
	"pgx":            "github.com/jackc/pgx/v5",
	"pgxpool":        "github.com/jackc/pgx/v5/pgxpool",
	"prometheus":     "github.com/prometheus/client_golang/prometheus",
	"redis":          "github.com/redis/go-redis/v9",
}

// workspaceFile is the Go workspace of the core module and its nested
// modules (fencedk8s), relative to the repository's root: the snippets
// build in it, so a page may use a nested module's packages.
const workspaceFile = ".ci/go.work"

// modulePackages maps the name of each package of the workspace's modules
// that a user can import (not internal, not main: the core module and the
// nested ones, such as fencedk8s) to its import path. A name two such
// packages share is left out: a page must then import it explicitly.
// Modules outside the workspace (bench/) are left out.
func modulePackages(t *testing.T, root string) map[string]string {
	t.Helper()
	work, err := os.ReadFile(filepath.Join(root, workspaceFile))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := modfile.ParseWork(workspaceFile, work, nil)
	if err != nil {
		t.Fatal(err)
	}
	inWork := map[string]bool{}
	for _, u := range wf.Use {
		inWork[filepath.Join(root, filepath.Dir(workspaceFile), filepath.FromSlash(u.Path))] = true
	}
	if !inWork[root] {
		t.Fatalf("%s does not use the root module", workspaceFile)
	}
	pkgs := map[string]string{}
	shared := map[string]bool{}
	fset := token.NewFileSet()
	// mods maps the directory of each module found so far to its path; a
	// file belongs to the module of its nearest directory in mods.
	mods := map[string]string{}
	modOf := func(dir string) (string, string) {
		for d := dir; ; d = filepath.Dir(d) {
			if m, ok := mods[d]; ok {
				return d, m
			}
			if d == root || d == filepath.Dir(d) {
				t.Fatalf("%s is in no module under %s", dir, root)
			}
		}
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "internal") {
				return filepath.SkipDir
			}
			mod, err := os.ReadFile(filepath.Join(p, "go.mod"))
			if os.IsNotExist(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if !inWork[p] {
				return filepath.SkipDir // a module outside the workspace
			}
			m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(mod)
			if m == nil {
				t.Fatalf("%s names no module", filepath.Join(p, "go.mod"))
			}
			mods[p] = string(m[1])
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		name := f.Name.Name
		if name == "main" || name == "docs" {
			return nil
		}
		modDir, modPath := modOf(filepath.Dir(p))
		rel, err := filepath.Rel(modDir, filepath.Dir(p))
		if err != nil {
			return err
		}
		importPath := path.Join(modPath, filepath.ToSlash(rel))
		if old, ok := pkgs[name]; ok && old != importPath {
			shared[name] = true
		}
		pkgs[name] = importPath
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range shared {
		delete(pkgs, name)
	}
	return pkgs
}

// genPackage is the source of one generated package: a file per part.
type genPackage struct {
	name  string            // the package name, also its directory under snippetDir
	files map[string]string // file name -> source
}

// packageNames returns the names the source declares at package level.
func packageNames(src string) map[string]bool {
	names := map[string]bool{}
	f, _ := parser.ParseFile(token.NewFileSet(), "", "package p\n"+src, parser.SkipObjectResolution)
	if f == nil {
		return names // the compiler reports the syntax error
	}
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			if decl.Recv == nil {
				names[decl.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.TypeSpec:
					names[spec.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names
}

// identifiers returns every identifier the source uses.
func identifiers(src string) map[string]bool {
	ids := map[string]bool{}
	f, _ := parser.ParseFile(token.NewFileSet(), "", "package p\n"+src, parser.SkipObjectResolution)
	if f == nil {
		return ids
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			ids[id.Name] = true
		}
		return true
	})
	return ids
}

// importsFor returns the import block a file needs: the packages named by
// the qualifiers x of its x.Name selectors that are not declared in the
// generated package (declared), not already imported (explicit), and known.
func importsFor(body string, known map[string]string, declared, explicit map[string]bool) string {
	// On a syntax error, which the compiler reports against the page, the
	// partial tree still names the packages, so no error follows from it.
	f, _ := parser.ParseFile(token.NewFileSet(), "", "package p\n"+body, parser.SkipObjectResolution)
	if f == nil {
		return ""
	}
	need := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && known[id.Name] != "" && !declared[id.Name] && !explicit[id.Name] {
				need[id.Name] = true
			}
		}
		return true
	})
	if len(need) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("import (\n")
	for _, name := range slices.Sorted(maps.Keys(need)) {
		p := known[name]
		if path.Base(p) == name {
			fmt.Fprintf(&b, "\t%q\n", p)
		} else {
			fmt.Fprintf(&b, "\t%s %q\n", name, p)
		}
	}
	b.WriteString(")\n")
	return b.String()
}

// explicitImports returns the names an import block binds (the last path
// element, or the alias; "_" and "." bind nothing checked here).
func explicitImports(block string) map[string]bool {
	names := map[string]bool{}
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+block, parser.ImportsOnly)
	if err != nil {
		return names
	}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := path.Base(p)
		if strings.HasPrefix(name, "v") && strings.Trim(name[1:], "0123456789") == "" {
			name = path.Base(path.Dir(p)) // .../v9 is named after the element before
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = true
	}
	return names
}

// overlaps reports whether the sets share a name.
func overlaps(a, b map[string]bool) bool {
	for n := range a {
		if b[n] {
			return true
		}
	}
	return false
}

// generate turns the snippets of one page into packages. Each snippet is a
// package of its own; the page's prelude and the top-level declarations of
// the page's earlier snippets that it uses are added to it, the way a
// reader carries them from block to block.
// preludePos is where the prelude's first line is, for //line.
func generate(page string, snippets []snippet, prelude, preludePos string, known map[string]string, first int) []genPackage {
	var out []genPackage
	var earlier []chunk // top-level declarations of the page so far
	for i, s := range snippets {
		pkg := genPackage{name: fmt.Sprintf("s%02d", first+i), files: map[string]string{}}
		if len(s.lines) > 0 && strings.HasPrefix(s.lines[0], "package ") {
			var b strings.Builder
			fmt.Fprintf(&b, "//line %s:%d\n", page, s.line)
			b.WriteString("package " + pkg.name + "\n")
			renderChunks(&b, page, []chunk{{line: s.line + 1, lines: s.lines[1:]}})
			pkg.files["snippet.go"] = b.String()
			out = append(out, pkg)
			continue
		}
		p := s.split()
		var body strings.Builder
		renderChunks(&body, page, p.decls)
		if len(p.stmts) > 0 {
			body.WriteString("func _() error {\n")
			renderChunks(&body, page, p.stmts)
			body.WriteString("return nil\n}\n")
		}
		var imports strings.Builder
		renderChunks(&imports, page, p.imports)

		// Carry the earlier declarations the snippet uses, and those they
		// use in turn; never one that declares a name the snippet declares.
		own := packageNames(body.String())
		used := identifiers(body.String())
		take := make([]bool, len(earlier))
		for changed := true; changed; {
			changed = false
			for j, c := range earlier {
				src := strings.Join(c.lines, "\n")
				names := packageNames(src)
				if take[j] || !overlaps(names, used) || overlaps(names, own) {
					continue
				}
				take[j], changed = true, true
				maps.Copy(used, identifiers(src))
			}
		}
		var carried []chunk
		for j, c := range earlier {
			if take[j] {
				carried = append(carried, c)
			}
		}
		var carriedSrc strings.Builder
		renderChunks(&carriedSrc, page, carried)

		declared := packageNames(prelude)
		for _, src := range []string{body.String(), carriedSrc.String()} {
			for n := range packageNames(src) {
				declared[n] = true
			}
		}
		explicit := explicitImports(imports.String())
		pkg.files["snippet.go"] = "package " + pkg.name + "\n" + imports.String() +
			importsFor(body.String(), known, declared, explicit) + body.String()
		if prelude != "" {
			pkg.files["prelude.go"] = "package " + pkg.name + "\n" +
				importsFor(prelude, known, declared, nil) + "//line " + preludePos + "\n" + prelude
		}
		if len(carried) > 0 {
			pkg.files["earlier.go"] = "package " + pkg.name + "\n" +
				importsFor(carriedSrc.String(), known, declared, nil) + carriedSrc.String()
		}
		out = append(out, pkg)
		earlier = append(earlier, p.decls...)
	}
	return out
}
