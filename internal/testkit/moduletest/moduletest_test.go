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

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

const (
	modPath = "github.com/fenced-dev/fenced"
	// k8sPath is the nested module of fencedk8s (and client-go), in the
	// directory fencedk8s.
	k8sPath = modPath + "/fencedk8s"
	// version is the pseudo-version the test publishes the working tree as
	// (both modules).
	version = "v0.0.0-20261203000000-000000000000"
)

// TestOutsideModule publishes the working tree as fenced@version and
// fenced/fencedk8s@version (the nested module, its go.mod requiring
// fenced@version as a release's does) in a file-based module proxy, then,
// from a scratch module outside the repository that requires fenced by
// version: builds a program importing every public package of fenced, runs
// it (a lease on mem: and on sqlite:), checks that client-go is not in the
// module's go.sum, then go gets fencedk8s as the docs say and runs a
// program that elects a leader with client-go's elector over it; and go
// installs cmd/fenced@version and runs the binary (version, and run on
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
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	realCache := strings.TrimSpace(run(t, root, nil, goBin, "env", "GOMODCACHE"))
	realProxy := strings.TrimSpace(run(t, root, nil, goBin, "env", "GOPROXY"))

	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	publish(t, modPath, root, proxy, nil)
	publish(t, k8sPath, filepath.Join(root, "fencedk8s"), proxy, releaseGoMod(t, filepath.Join(root, "fencedk8s", "go.mod")))

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
	// A module that does not import fencedk8s does not carry client-go.
	gosum, err := os.ReadFile(filepath.Join(scratch, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(gosum), "k8s.io/") {
		t.Errorf("the go.sum of a module that imports fenced's packages but not fencedk8s lists k8s.io modules:\n%s", gosum)
	}
	logGraph(t, scratch, env, goBin, "fenced's packages")

	// fencedk8s, as docs/kubernetes.md installs it.
	writeElect(t, filepath.Join(scratch, "elect"))
	run(t, scratch, env, goBin, "get", k8sPath+"@"+version)
	run(t, scratch, env, goBin, "mod", "tidy")
	out = run(t, scratch, env, goBin, "run", "./elect")
	if !strings.Contains(out, "leading elect-1 fence 1\n") || !strings.Contains(out, "stopped leading\n") {
		t.Errorf("the fencedk8s program did not lead and stop:\n%s", out)
	}
	logGraph(t, scratch, env, goBin, "fenced's packages and fencedk8s")

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

// logGraph logs what the module at dir, which imports what, carries: the
// lines of its go list -m all and of its go.sum (docs/dependencies.md).
func logGraph(t *testing.T, dir string, env []string, goBin, what string) {
	t.Helper()
	mods := strings.Count(run(t, dir, env, goBin, "list", "-m", "all"), "\n")
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a module importing %s: %d lines in go list -m all, %d in go.sum", what, mods, bytes.Count(sum, []byte("\n")))
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

// releaseGoMod returns the go.mod at path as its module's release has it:
// requiring fenced@version, the version released with it (the working tree
// requires a version a Go workspace resolves; see docs/dependencies.md).
func releaseGoMod(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.AddRequire(modPath, version); err != nil {
		t.Fatal(err)
	}
	out, err := f.Format()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// publish writes the module path@version, zipped from the directory dir
// of the working tree, in the module proxy layout under proxy. A non-nil
// gomod replaces the module's go.mod.
func publish(t *testing.T, path, src, proxy string, gomod []byte) {
	t.Helper()
	if gomod != nil {
		// The zip is made from a copy whose go.mod is gomod.
		cp := filepath.Join(t.TempDir(), "module")
		if err := os.CopyFS(cp, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cp, "go.mod"), gomod, 0o644); err != nil {
			t.Fatal(err)
		}
		src = cp
	}
	dir := filepath.Join(proxy, path, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := modzip.CreateFromDir(f, module.Version{Path: path, Version: version}, src); err != nil {
		f.Close()
		t.Fatalf("zip the module: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(src, "go.mod"))
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
		version + ".mod":  mod,
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

// writeElect writes, at dir, a program of the scratch module that elects
// a leader with client-go's elector over a fencedk8s lock on mem:, prints
// "leading ID fence N" when it leads, then steps down (ReleaseOnCancel)
// and prints "stopped leading".
func writeElect(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	main := `package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedk8s"
	_ "github.com/fenced-dev/fenced/mem"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := fenced.Open(ctx, "mem:", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lock, err := fencedk8s.New(client, "controller", "elect-1", &fencedk8s.Options{
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				_, l := lock.LeaderContext(ctx)
				if l == nil {
					log.Fatal("leading without a lease")
				}
				fmt.Printf("leading %s fence %d\n", lock.Identity(), l.Fence())
				cancel()
			},
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
		},
	})
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
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
