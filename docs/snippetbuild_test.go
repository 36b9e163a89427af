package docs

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// snippetDir is where the generated packages appear, through the build's
// overlay only: nothing is written into the tree. It must not exist.
const snippetDir = "docs/snippetcheck"

// ignored matches the compiler errors a snippet may leave: a page shows
// how to get a value without always showing its use.
var ignored = regexp.MustCompile(`: (declared and not used: \w+|"[^"]+" imported (as \w+ )?and not used)$`)

// buildPackages compiles the packages with one go build over an overlay
// and returns the compiler's errors other than those ignored, deduplicated,
// each with the lines that explain it (have, want).
func buildPackages(t *testing.T, root string, pkgs []genPackage) []string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, snippetDir)); err == nil {
		t.Fatalf("%s exists; the test generates it through an overlay and needs it absent", snippetDir)
	}
	tmp := t.TempDir()
	if d := os.Getenv("FENCED_SNIPPETS_KEEP"); d != "" {
		tmp = d // a directory to keep the generated files in, to read them
	}
	overlay := map[string]map[string]string{"Replace": {}}
	// In the configuration of scripts/test.sh's vet step (CGO_ENABLED=0,
	// -trimpath), whose compiles of the dependencies this build reuses.
	args := []string{"build", "-trimpath", "-overlay", filepath.Join(tmp, "overlay.json"), "-gcflags=-e"}
	for _, pkg := range pkgs {
		for name, src := range pkg.files {
			file := filepath.Join(tmp, pkg.name+"_"+name)
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			overlay["Replace"][filepath.Join(root, snippetDir, pkg.name, name)] = file
		}
		args = append(args, "./"+snippetDir+"/"+pkg.name)
	}
	js, err := json.Marshal(overlay)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "overlay.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	// In the workspace of the core module and the nested ones, so that a
	// page's snippets may use fencedk8s (and client-go), which the core
	// module does not require.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK="+filepath.Join(root, workspaceFile))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("go build of %d snippet packages took %v", len(pkgs), time.Since(start).Round(time.Millisecond))
	// An error is a line and the indented lines that follow it (have/want).
	var all []string
	for _, l := range strings.Split(out.String(), "\n") {
		switch {
		case l == "" || strings.HasPrefix(l, "# "):
		case strings.HasPrefix(l, "\t") && len(all) > 0:
			all[len(all)-1] += "\n" + l
		default:
			all = append(all, l)
		}
	}
	seen := map[string]bool{}
	var errs []string
	for _, e := range all {
		if ignored.MatchString(e) || seen[e] {
			continue
		}
		seen[e] = true
		errs = append(errs, e)
	}
	if runErr != nil && len(errs) == 0 && !strings.Contains(out.String(), "not used") {
		t.Fatalf("go build failed without a compiler error: %v\n%s", runErr, out.String())
	}
	sort.Strings(errs)
	return errs
}
