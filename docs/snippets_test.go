package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// selfCheck is a page of snippets the test knows the verdict of: each
// "bad" line must be reported, each "good" block must build. It runs in
// the same go build as the real pages, so a check that stopped seeing
// errors fails instead of passing every page.
const selfCheck = "```go\n" +
	"client, err := fenced.Open(ctx, \"mem://self\", nil)\n" +
	"defer client.Close()\n" +
	"```\n" +
	"```go\n" +
	"client, _ := fenced.Open(ctx, \"mem://self\", nil)\n" +
	"client.Do(ctx, \"k\", nil, func(ctx context.Context) error { return nil }) // bad: wrong signature\n" +
	"fenced.OpenURL(ctx, \"mem://self\") // bad: no such name\n" +
	"```\n"

// undefinedName matches the error of a plain name no declaration gives.
var undefinedName = regexp.MustCompile(`: undefined: [a-z]\w*$`)

// preludePos returns the position of the page's prelude in
// preludes_test.go, where the compiler's errors in it point.
func preludePos(t *testing.T, page string) string {
	t.Helper()
	src, err := os.ReadFile("preludes_test.go")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(src), strconv.Quote(page)+": `")
	if i < 0 {
		return "docs/preludes_test.go:1" // the page has no prelude
	}
	return fmt.Sprintf("docs/preludes_test.go:%d", strings.Count(string(src[:i]), "\n")+1)
}

// TestGoSnippetsCompile extracts every ```go block of README.md and
// docs/*.md and compiles it against the module's code: a block that
// starts with a package clause as a file, any other as its imports, its
// top-level declarations and its statements wrapped in a function, with
// the imports it leaves out inferred from the package names it uses and
// the names it leaves to the reader declared by its page's prelude
// (preludes_test.go; a page that leaves nothing out needs none). Only "declared and not used" and "imported and not
// used" are forgiven. A snippet that names a renamed identifier, or calls
// one with the wrong arguments, fails here with its page and line.
func TestGoSnippetsCompile(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	known := modulePackages(t, root)
	if known["fenced"] == "" || known["fence"] == "" || known["recipe"] == "" || known["fencedk8s"] == "" {
		t.Fatalf("found the modules' packages %v, without fenced, fence, recipe or fencedk8s: the walk is broken", known)
	}
	for name, p := range stdImports {
		if _, ok := known[name]; ok {
			t.Fatalf("package name %s is both the module's (%s) and %s", name, known[name], p)
		}
		known[name] = p
	}

	pages := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		rel, _ := filepath.Rel(root, p)
		pages = append(pages, filepath.ToSlash(rel))
	}
	var pkgs []genPackage
	count := map[string]int{}
	for _, page := range pages {
		snippets := readSnippets(t, root, page)
		count[page] = len(snippets)
		pkgs = append(pkgs, generate(page, snippets, preludes[page], preludePos(t, page), known, len(pkgs))...)
	}
	for page := range preludes {
		if count[page] == 0 && page != "selfcheck.md" {
			t.Errorf("preludes_test.go has a prelude for %s, which has no Go snippet", page)
		}
	}

	// The self-check page, from memory.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "selfcheck.md"), []byte(selfCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	self := readSnippets(t, dir, "selfcheck.md")
	pkgs = append(pkgs, generate("selfcheck.md", self, preludes["selfcheck.md"], preludePos(t, "selfcheck.md"), known, len(pkgs))...)
	if len(pkgs) < 15 {
		t.Fatalf("found only %d Go snippets: the extraction is broken", len(pkgs))
	}

	var selfErrs []string
	for _, e := range buildPackages(t, root, pkgs) {
		if strings.HasPrefix(e, "selfcheck.md:") {
			selfErrs = append(selfErrs, e)
			continue
		}
		if undefinedName.MatchString(e) {
			e += "\n\t(a name the page leaves to the reader is declared in docs/preludes_test.go)"
		}
		t.Error(e)
	}
	var bad []int
	for i, l := range strings.Split(selfCheck, "\n") {
		if strings.Contains(l, "// bad:") {
			bad = append(bad, i+1)
		}
	}
	for _, line := range bad {
		found := false
		for _, e := range selfErrs {
			found = found || strings.HasPrefix(e, fmt.Sprintf("selfcheck.md:%d:", line))
		}
		if !found {
			t.Errorf("the self-check's error at selfcheck.md:%d was not reported; the check is broken (reported: %q)", line, selfErrs)
		}
	}
	if len(selfErrs) != len(bad) {
		t.Errorf("the self-check expected %d errors, got %q", len(bad), selfErrs)
	}
	t.Logf("compiled %d Go snippets of %d pages", len(pkgs)-len(self), len(pages))
}
