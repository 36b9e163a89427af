package recipe_test

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// recipeSources returns the package's non-test Go files.
func recipeSources(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var srcs []string
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			srcs = append(srcs, f)
		}
	}
	if len(srcs) == 0 {
		t.Fatal("no recipe sources found")
	}
	return srcs
}

// TestRecipesImportOnlyPublicPackages checks that the recipes reach the
// Client through its public API only: not the driver package (a recipe
// asks the Client, never a driver), no internal package, no unsafe (so
// no go:linkname), no reflect.
func TestRecipesImportOnlyPublicPackages(t *testing.T) {
	const mod = "github.com/fenced-dev/fenced"
	allowed := map[string]bool{mod: true, mod + "/clock": true}
	for _, f := range recipeSources(t) {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case path == "unsafe", path == "reflect":
				t.Errorf("%s imports %s", f, path)
			case strings.HasPrefix(path, mod) && !allowed[path]:
				t.Errorf("%s imports %s; recipes may import only %s and its clock package", f, path, mod)
			case strings.Contains(path, "internal"):
				t.Errorf("%s imports the internal package %s", f, path)
			}
		}
		for _, cg := range file.Comments {
			if strings.Contains(cg.Text(), "go:linkname") {
				t.Errorf("%s has a go:linkname directive", f)
			}
		}
	}
}

// TestRecipesBuildOutsideTheModule copies the recipe sources into a
// module of their own (as a user's recipes would be) and builds them
// against this module through a workspace. Go forbids importing another
// module's internal packages and unexported names, so the build succeeds
// only if the recipes need nothing but the public API.
func TestRecipesBuildOutsideTheModule(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range recipeSources(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goVersion := strings.TrimPrefix(runtime.Version(), "go")
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/userrecipes\n\ngo "+goVersion+"\n")
	write("go.work", "go "+goVersion+"\n\nuse (\n\t.\n\t"+strconv.Quote(root)+"\n)\n")
	// CGO_ENABLED=0 and -trimpath: scripts/test.sh's vet step compiled
	// the dependencies in this configuration already.
	cmd := exec.Command("go", "build", "-trimpath", "-o", os.DevNull, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-mod=readonly", "GOTOOLCHAIN=local", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the recipes do not build as a separate module of the public API: %v\n%s", err, out)
	}
}
