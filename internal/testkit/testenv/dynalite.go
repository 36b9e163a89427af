package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// DynaliteVersion is the version of the npm package dynalite (a
// DynamoDB-compatible server on Node.js, backed by LevelDB) that
// scripts/test.sh installs and StartDynalite requires.
const DynaliteVersion = "4.0.0"

// DynaliteDir returns the directory dynalite is installed into (as
// node_modules/dynalite): $FENCED_DYNALITE_DIR if set, otherwise
// fenced/dynalite under the user's cache directory
// (${XDG_CACHE_HOME:-$HOME/.cache}). It is outside the repository, so the
// package is fetched once per machine, not per checkout.
func DynaliteDir() string {
	if d := os.Getenv("FENCED_DYNALITE_DIR"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "fenced", "dynalite")
}

// Dynalite is a dynalite server started for a test.
type Dynalite struct {
	*Process
	Port int
	// Path is the LevelDB directory, or "" for an in-memory server.
	Path string
	t    testing.TB
	host *NetHost
}

// DynaliteConfig configures StartDynalite.
type DynaliteConfig struct {
	// Persistent keeps the data in a LevelDB directory, so the server can be
	// killed and started again on it (StartAgain); otherwise it is in
	// memory.
	Persistent bool
	// Host, if set, runs the server on that host of a Net, listening on
	// its address (for partitions at the packet level); nil is loopback.
	Host *NetHost
}

// Endpoint returns the server's HTTP endpoint, http://127.0.0.1:port.
func (d *Dynalite) Endpoint() string { return "http://" + hostAddr(d.host, d.Port) }

// URL returns a dynamodb:// store URL for table on this server, with query
// (which may be empty) appended.
func (d *Dynalite) URL(table, query string) string {
	u := "dynamodb://" + hostAddr(d.host, d.Port) + "/" + table
	if query != "" {
		u += "?" + query
	}
	return u
}

// StartDynalite starts dynalite with Node.js on a free loopback port and
// waits until it accepts connections. It is killed when the test ends.
// Tables stay in the CREATING state for dynalite's default 500ms, as a real
// DynamoDB table does for a while. So table creation is exercised for real.
//
// Node.js comes from Debian's nodejs package and dynalite from npm, pinned
// to DynaliteVersion, in DynaliteDir(); scripts/test.sh installs both. A
// missing or different installation fails the test (never skips it).
func StartDynalite(t testing.TB, cfg DynaliteConfig) *Dynalite {
	t.Helper()
	if _, ok := FindBinary("node", "nodejs"); !ok {
		t.Fatal("testenv: node not found; install the Debian package \"nodejs\" (scripts/test.sh does)")
	}
	dir := filepath.Join(DynaliteDir(), "node_modules", "dynalite")
	cli := filepath.Join(dir, "cli.js")
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("testenv: dynalite not installed in %s (%v); run scripts/test.sh, or: npm install --prefix %s dynalite@%s",
			DynaliteDir(), err, DynaliteDir(), DynaliteVersion)
	}
	var pkg struct{ Version string }
	if b, err := os.ReadFile(filepath.Join(dir, "package.json")); err != nil || json.Unmarshal(b, &pkg) != nil ||
		pkg.Version != DynaliteVersion {
		t.Fatalf("testenv: dynalite in %s is version %q, want %s; run scripts/test.sh", dir, pkg.Version, DynaliteVersion)
	}
	d := &Dynalite{Port: FreePort(t), t: t, host: cfg.Host}
	if cfg.Persistent {
		d.Path = TempDir(t, "dynalite")
	}
	d.start()
	return d
}

// dynalitePreload is loaded before dynalite's CLI. dynalite 4.0.0 throws
// from a request's error handler when a client closes its connection in
// the middle of a request (a cancelled context, a closed client), which
// kills the whole server; a real DynamoDB shrugs that off, so the preload
// logs such an error and carries on. Any other uncaught error still ends
// the server.
const dynalitePreload = `process.on('uncaughtException', function (err) {
  if (err && err.code === 'ECONNRESET') {
    console.error('dynalite: a client aborted a request (ignored): ' + err.message)
    return
  }
  console.error(err)
  process.exit(1)
})
`

func (d *Dynalite) start() {
	d.t.Helper()
	node, _ := FindBinary("node", "nodejs")
	cli := filepath.Join(DynaliteDir(), "node_modules", "dynalite", "cli.js")
	preload := filepath.Join(TempDir(d.t, "dynalite-preload"), "preload.js")
	if err := os.WriteFile(preload, []byte(dynalitePreload), 0o644); err != nil {
		d.t.Fatalf("testenv: %v", err)
	}
	args := []string{"--require", preload, cli, "--host", hostIP(d.host), "--port", strconv.Itoa(d.Port)}
	if d.Path != "" {
		args = append(args, "--path", d.Path)
	}
	d.Process = startServer(d.t, d.host, fmt.Sprintf("dynalite:%d", d.Port), exec.Command(node, args...))
	d.WaitPort(d.t, hostAddr(d.host, d.Port), 30*time.Second)
}

// StartAgain starts the server again on the same port and data after Kill.
// Only a persistent server keeps its tables.
func (d *Dynalite) StartAgain(t testing.TB) {
	t.Helper()
	select {
	case <-d.Exited():
	default:
		t.Fatalf("testenv: %s started again while it is still running", d.Name)
	}
	d.t = t
	d.start()
}
