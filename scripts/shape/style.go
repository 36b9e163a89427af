package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// styleCount is what the style report measures.
type styleCount struct {
	sentences, words int
	longLines        []string
	longErrors       []string
	longFuncs        []string
}

// reportStyle measures the folders roots (the module when empty).
func reportStyle(roots []string) error {
	if len(roots) == 0 {
		roots = []string{"."}
	}
	var c styleCount
	for _, root := range roots {
		err := filepath.WalkDir(filepath.Clean(root), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != filepath.Clean(root) && (strings.HasPrefix(d.Name(), ".") || isCopy(path) || isModule(path)) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			return styleFile(path, &c)
		})
		if err != nil {
			return err
		}
	}
	for _, l := range c.longLines {
		fmt.Println("long line:", l)
	}
	for _, e := range c.longErrors {
		fmt.Println("long error string:", e)
	}
	for _, f := range c.longFuncs {
		fmt.Println("long function:", f)
	}
	avg := 0.0
	if c.sentences > 0 {
		avg = float64(c.words) / float64(c.sentences)
	}
	fmt.Printf("doc comments: %d sentences, %.1f words a sentence; %d lines over 140 columns; "+
		"%d error strings over 120 characters; %d functions over 100 lines\n",
		c.sentences, avg, len(c.longLines), len(c.longErrors), len(c.longFuncs))
	return nil
}

// isCopy reports whether dir holds the go-zookeeper copy.
func isCopy(dir string) bool {
	dir = filepath.ToSlash(dir)
	return strings.HasSuffix(dir, "fencedzookeeper/zk") || strings.HasSuffix(dir, "fencedzookeeper/internal/zk")
}

// isModule reports whether dir is the root of a nested module.
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

func styleFile(path string, c *styleCount) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, line := range strings.Split(string(src), "\n") {
		if n := columns(line); n > 140 {
			c.longLines = append(c.longLines, fmt.Sprintf("%s:%d (%d)", path, i+1, n))
		}
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return err
	}
	for _, decl := range f.Decls {
		for _, doc := range exportedDocs(decl) {
			countSentences(doc.Text(), c)
		}
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > 100 {
				c.longFuncs = append(c.longFuncs, fmt.Sprintf("%s %s (%d lines)", fset.Position(fn.Pos()), fn.Name.Name, n))
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 || !isErrorCall(call.Fun) {
			return true
		}
		if s, ok := constString(call.Args[0]); ok && len(s) > 120 {
			c.longErrors = append(c.longErrors, fmt.Sprintf("%s (%d)", fset.Position(call.Args[0].Pos()), len(s)))
		}
		return true
	})
	return nil
}

// constString returns the value of a string literal, or of literals
// joined by +, so that a message split over source lines still counts
// whole.
func constString(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok := constString(e.X)
		if !ok {
			return "", false
		}
		y, ok := constString(e.Y)
		return x + y, ok
	case *ast.ParenExpr:
		return constString(e.X)
	}
	return "", false
}

// columns counts a line's columns with a tab as 4.
func columns(line string) int {
	return len([]rune(line)) + 3*strings.Count(line, "\t")
}

// exportedDocs returns the doc comments of the exported names decl
// declares.
func exportedDocs(decl ast.Decl) []*ast.CommentGroup {
	var docs []*ast.CommentGroup
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if d.Name.IsExported() && d.Doc != nil {
			docs = append(docs, d.Doc)
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			var exported bool
			var doc *ast.CommentGroup
			switch s := spec.(type) {
			case *ast.TypeSpec:
				exported, doc = s.Name.IsExported(), s.Doc
			case *ast.ValueSpec:
				exported, doc = len(s.Names) > 0 && s.Names[0].IsExported(), s.Doc
			}
			if doc == nil && len(d.Specs) == 1 {
				doc = d.Doc
			}
			if exported && doc != nil {
				docs = append(docs, doc)
			}
		}
	}
	return docs
}

func isErrorCall(fun ast.Expr) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok {
		return false
	}
	return pkg.Name == "errors" && sel.Sel.Name == "New" || pkg.Name == "fmt" && sel.Sel.Name == "Errorf"
}

// countSentences adds the sentences of a doc comment's prose to c.
func countSentences(text string, c *styleCount) {
	var prose []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "  ") {
			continue // code or a preformatted block
		}
		prose = append(prose, line)
	}
	flat := strings.Join(strings.Fields(strings.Join(prose, " ")), " ")
	for _, end := range []string{"? ", "! "} {
		flat = strings.ReplaceAll(flat, end, ". ")
	}
	for _, s := range strings.Split(flat, ". ") {
		if n := len(strings.Fields(s)); n > 0 {
			c.sentences++
			c.words += n
		}
	}
}
