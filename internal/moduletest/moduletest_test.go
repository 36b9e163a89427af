package moduletest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

const (
	modPath = "github.com/fenced-dev/fenced"
	// version is the pseudo-version the test publishes the working tree as.
	version = "v0.0.0-20261203000000-000000000000"
)

// TestOutsideModule publishes the working tree as fenced@version in a
// file-based module proxy, then, from a scratch module outside the
// repository that requires it by version: builds a program importing every
// public package of fenced, runs it (a lease on mem: and on sqlite:), and
// go installs cmd/fenced@version and runs the binary (version, and run on
// sqlite:). Everything but fenced comes from the local module cache's
// download directory where it is there, and from the go command's own
// GOPROXY otherwise: go mod tidy also wants the modules that only the
// tests of fenced's dependencies import, which a fresh machine's cache
// lacks (building fenced never downloads them).
func TestOutsideModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every package of fenced from a scratch module; not in -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	realCache := strings.TrimSpace(run(t, root, nil, goBin, "env", "GOMODCACHE"))
	realProxy := strings.TrimSpace(run(t, root, nil, goBin, "env", "GOPROXY"))

	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	publish(t, root, proxy)

	// A module cache of its own, so that fenced@version is extracted
	// fresh from this run's zip (a shared cache would keep an earlier
	// run's tree under the same version); -trimpath keeps the build cache
	// keys independent of where that cache lives, so dependencies compiled
	// once stay cached across runs. The build cache is the go command's
	// own: it is content-addressed, so a package compiled from the same
	// files with the same flags is the same whoever compiled it.
	// scripts/test.sh runs go vet in this configuration (CGO_ENABLED=0,
	// -trimpath) first, so on a new machine the dependencies compile once,
	// there, not again here (modernc.org/sqlite and client-go alone take
	// minutes on two cores).
	env := []string{
		"GOMODCACHE=" + filepath.Join(tmp, "modcache"),
		"GOPROXY=" + scratchProxy(proxy, filepath.Join(realCache, "cache", "download"), realProxy),
		"GOSUMDB=off",
		"GONOSUMDB=", "GONOSUMCHECK=", "GOPRIVATE=", "GONOPROXY=",
		"GOFLAGS=-modcacherw -trimpath -buildvcs=false",
		"GOTOOLCHAIN=local",
		"GOWORK=off",
		"CGO_ENABLED=0",
	}

	pkgs := publicPackages(t, root, goBin)
	scratch := filepath.Join(tmp, "scratch")
	writeScratch(t, scratch, pkgs)
	run(t, scratch, env, goBin, "mod", "tidy")
	gomod, err := os.ReadFile(filepath.Join(scratch, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), modPath+" "+version) {
		t.Fatalf("scratch go.mod does not require %s %s:\n%s", modPath, version, gomod)
	}
	run(t, scratch, env, goBin, "vet", ".")
	out := run(t, scratch, append(env, "SQLITE_PATH="+filepath.Join(tmp, "leases.db")), goBin, "run", ".")
	for _, want := range []string{"mem: fence ", "sqlite: fence "} {
		if !strings.Contains(out, want) {
			t.Errorf("scratch program output lacks %q:\n%s", want, out)
		}
	}

	// go install pkg@version, outside any module, as the README says.
	gobin := filepath.Join(tmp, "bin")
	away := filepath.Join(tmp, "away")
	if err := os.MkdirAll(away, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, away, append(env, "GOBIN="+gobin), goBin, "install", modPath+"/cmd/fenced@"+version)
	fencedBin := filepath.Join(gobin, "fenced")
	out = run(t, away, nil, fencedBin, "version")
	if !strings.Contains(out, "fenced "+version+"\n") {
		t.Errorf("fenced version does not name %s:\n%s", version, out)
	}
	store := "sqlite://" + filepath.ToSlash(filepath.Join(tmp, "cli.db"))
	out = run(t, away, nil, fencedBin, "--store", store, "run", "job", "--", "sh", "-c", `echo "fence=$FENCED_FENCE"`)
	if !strings.Contains(out, "fence=1") {
		t.Errorf("fenced run on sqlite printed no fence 1:\n%s", out)
	}
}

// scratchProxy is the GOPROXY list of the scratch module: the published
// fenced first, then the local download cache, then the go command's own
// proxies (off and direct dropped: a module missing from every proxy is a
// failure, not a fetch from its origin).
func scratchProxy(published, cache, goproxy string) string {
	list := []string{"file://" + filepath.ToSlash(published), "file://" + filepath.ToSlash(cache)}
	for _, p := range strings.FieldsFunc(goproxy, func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "off" && p != "direct" && p != "" {
			list = append(list, p)
		}
	}
	return strings.Join(list, ",")
}

// publish writes fenced@version, zipped from the working tree at root, in
// the module proxy layout under proxy.
func publish(t *testing.T, root, proxy string) {
	t.Helper()
	dir := filepath.Join(proxy, modPath, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := modzip.CreateFromDir(f, module.Version{Path: modPath, Version: version}, root); err != nil {
		f.Close()
		t.Fatalf("zip the module: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := json.Marshal(struct{ Version, Time string }{version, "2026-12-03T00:00:00Z"})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// publicPackages lists the import paths of fenced's library packages: every
// package of the module but commands, internal packages and test-only ones.
func publicPackages(t *testing.T, root, goBin string) []string {
	t.Helper()
	out := run(t, root, nil, goBin, "list", "-f", "{{.ImportPath}} {{.Name}}", "./...")
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		path, name, _ := strings.Cut(line, " ")
		if name == "main" || strings.Contains(path+"/", "/internal/") {
			continue
		}
		pkgs = append(pkgs, path)
	}
	if len(pkgs) < 10 {
		t.Fatalf("found only %d public packages: %v", len(pkgs), pkgs)
	}
	return pkgs
}

// writeScratch writes a module at dir that requires fenced@version and
// imports every package in pkgs; its main runs a lease on mem: and on the
// SQLite file $SQLITE_PATH.
func writeScratch(t *testing.T, dir string, pkgs []string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gomod := fmt.Sprintf("module example.com/scratch\n\ngo 1.26.0\n\nrequire %s %s\n", modPath, version)
	var imports bytes.Buffer
	for _, p := range pkgs {
		if p == modPath {
			continue
		}
		fmt.Fprintf(&imports, "\t_ %q\n", p)
	}
	main := `package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fenced-dev/fenced"
` + imports.String() + `)

func main() {
	ctx := context.Background()
	stores := []struct{ name, url string }{
		{"mem:", "mem:"},
		{"sqlite:", "sqlite://" + os.Getenv("SQLITE_PATH")},
	}
	for _, s := range stores {
		client, err := fenced.Open(ctx, s.url, nil)
		if err != nil {
			log.Fatal(err)
		}
		err = client.Do(ctx, "job", &fenced.LeaseOptions{TTL: 10 * time.Second}, func(ctx context.Context, l *fenced.Lease) error {
			fmt.Printf("%s fence %d\n", s.name, l.Fence())
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		if err := client.Close(); err != nil {
			log.Fatal(err)
		}
	}
}
`
	for name, data := range map[string]string{"go.mod": gomod, "main.go": main} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// run runs name with args in dir (env added to the test's environment) and
// returns its standard output, failing the test if it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	// Standard output only is returned: the go command writes progress
	// ("go: downloading ...") on standard error.
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s (%v)", filepath.Base(name), strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s %s in %s: %v\n%s%s", name, strings.Join(args, " "), dir, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.String()
}
