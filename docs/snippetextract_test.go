package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippet is one ```go block of a Markdown page.
type snippet struct {
	page  string // the page, relative to the module root: README.md, docs/guards.md
	line  int    // the page's line of the block's first line of code
	lines []string
}

// goBlock matches the opening of a Go block, possibly indented (in a list).
var goBlock = regexp.MustCompile("^([ \t]*)```go[ \t]*$")

// readSnippets returns the ```go blocks of the page in order. A line that
// is only "..." stands for code the page leaves out, and becomes blank.
func readSnippets(t *testing.T, root, page string) []snippet {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	var out []snippet
	lines := strings.Split(string(text), "\n")
	for i := 0; i < len(lines); i++ {
		m := goBlock.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		s := snippet{page: page, line: i + 2}
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			l := strings.TrimPrefix(lines[i], m[1])
			if strings.TrimSpace(l) == "..." {
				l = ""
			}
			s.lines = append(s.lines, l)
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: the ```go block is not closed", page, s.line-1)
		}
		out = append(out, s)
	}
	return out
}

// chunk is a run of a page's lines, kept with its first line number so the
// generated file can point the compiler back at the page.
type chunk struct {
	line  int
	lines []string
}

// parts is a snippet split the way a reader reads it: its import block,
// its top-level declarations, and the statements left to run in a function.
type parts struct {
	imports, decls, stmts []chunk
}

// topLevel matches the first line of a top-level declaration: func, type,
// var or const at column 0.
var topLevel = regexp.MustCompile(`^(func|type|var|const) `)

// split divides a snippet that does not start with a package clause. A
// declaration whose first line ends in "{" or "(" (or whose signature,
// wrapped after a comma, ends so) runs to the next line at column 0 that
// closes it; comment lines right before a declaration
// are its doc comment.
func (s snippet) split() parts {
	var p parts
	add := func(to *[]chunk, line int, l string) {
		if n := len(*to); n > 0 && (*to)[n-1].line+len((*to)[n-1].lines) == line {
			(*to)[n-1].lines = append((*to)[n-1].lines, l)
			return
		}
		*to = append(*to, chunk{line: line, lines: []string{l}})
	}
	var comments []int // indexes of pending column-0 comment lines
	flush := func(to *[]chunk) {
		for _, j := range comments {
			add(to, s.line+j, s.lines[j])
		}
		comments = nil
	}
	for i := 0; i < len(s.lines); i++ {
		l := s.lines[i]
		switch {
		case strings.HasPrefix(l, "//"):
			comments = append(comments, i)
		case strings.HasPrefix(l, "import "):
			flush(&p.imports)
			add(&p.imports, s.line+i, l)
			if strings.HasSuffix(l, "(") {
				for i++; i < len(s.lines); i++ {
					add(&p.imports, s.line+i, s.lines[i])
					if s.lines[i] == ")" {
						break
					}
				}
			}
		case topLevel.MatchString(l):
			flush(&p.decls)
			add(&p.decls, s.line+i, l)
			// A signature wrapped after a comma runs on to the line that
			// opens its body.
			for strings.HasSuffix(l, ",") && i+1 < len(s.lines) {
				i++
				l = s.lines[i]
				add(&p.decls, s.line+i, l)
			}
			if end := l[len(l)-1]; end == '{' || end == '(' {
				closer := map[byte]string{'{': "}", '(': ")"}[end]
				for i++; i < len(s.lines); i++ {
					add(&p.decls, s.line+i, s.lines[i])
					if s.lines[i] == closer {
						break
					}
				}
			}
		default:
			flush(&p.stmts)
			add(&p.stmts, s.line+i, l)
		}
	}
	flush(&p.stmts)
	return p
}
