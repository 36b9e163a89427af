package testenv

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Postgres is a PostgreSQL server started for tests from Debian's
// postgresql package. It has its own cluster in a temporary directory and a
// unix socket in that directory. It listens on TCP on a free loopback port,
// with password (SCRAM) authentication for TCP clients.
type Postgres struct {
	// User and Password are the superuser's credentials; Database is the
	// database the URLs name.
	User, Password, Database string
	// Port is the TCP port on 127.0.0.1 (or on the Net host's address,
	// StartPostgresOn).
	Port int
	// Dir holds the data directory and the unix socket.
	Dir string

	bin       string
	startArgs []string
	clock     *WallClock
	host      *NetHost
	restartable
}

// StartPostgres initializes a cluster and starts PostgreSQL, as user
// "nobody" when the test runs as root. The server is stopped when t ends.
// Extra server settings ("name=value") are passed with -c.
func StartPostgres(t testing.TB, settings ...string) *Postgres {
	t.Helper()
	return StartPostgresOnClock(t, nil, settings...)
}

// StartPostgresOnClock is StartPostgres with the server reading clock as
// its wall clock (now(), statement timestamps), also after a restart; a
// nil clock is the host's.
func StartPostgresOnClock(t testing.TB, clock *WallClock, settings ...string) *Postgres {
	t.Helper()
	return startPostgres(t, clock, nil, settings)
}

// StartPostgresOn is StartPostgres with the server on host h of a Net,
// listening on h's address (for partitions at the packet level).
func StartPostgresOn(t testing.TB, h *NetHost, settings ...string) *Postgres {
	t.Helper()
	return startPostgres(t, nil, h, settings)
}

func startPostgres(t testing.TB, clock *WallClock, h *NetHost, settings []string) *Postgres {
	t.Helper()
	initdb := RequireBinary(t, "postgresql", "initdb")
	bin := filepath.Dir(initdb)
	dir := TempDir(t, "pg")
	p := &Postgres{User: "fenced", Password: "pg-secret-" + strconv.Itoa(os.Getpid()), Database: "postgres", Dir: dir, bin: bin,
		clock: clock, host: h}
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(p.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ChownNobody(t, dir)
	cmd := exec.Command(initdb, "-D", filepath.Join(dir, "data"), "-U", p.User, "--pwfile", pwfile,
		"--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	RunAsNobody(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	os.Remove(pwfile)
	if h != nil {
		// initdb lets TCP clients in from loopback only; on a Net host
		// they come from the other hosts.
		hba, err := os.OpenFile(filepath.Join(dir, "data", "pg_hba.conf"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = hba.WriteString("host all all samenet scram-sha-256\n")
		if cerr := hba.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	p.Port = FreePort(t)
	args := []string{"-D", filepath.Join(dir, "data"), "-p", strconv.Itoa(p.Port), "-k", dir,
		"-c", "listen_addresses=" + hostIP(h), "-c", "max_connections=400", "-c", "shared_buffers=32MB",
		"-c", "log_min_messages=warning", "-c", "log_min_error_statement=panic"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	p.startArgs = args
	p.start(t)
	t.Cleanup(p.Kill)
	return p
}

func (p *Postgres) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), p.startArgs...)
	RunAsNobody(cmd)
	p.clock.Apply(cmd)
	proc := startServer(t, p.host, "postgres", cmd)
	proc.WaitLog(t, "database system is ready to accept connections", 60*time.Second)
	proc.WaitPort(t, hostAddr(p.host, p.Port), 30*time.Second)
	p.running(proc)
}

// URL returns a postgres:// URL for the server with the given extra query
// parameters (for example "table=x").
func (p *Postgres) URL(params ...string) string {
	return p.URLAs(p.User, p.Password, params...)
}

// URLAs is URL with other credentials.
func (p *Postgres) URLAs(user, password string, params ...string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: hostAddr(p.host, p.Port), Path: "/" + p.Database}
	q := "sslmode=disable"
	for _, s := range params {
		q += "&" + s
	}
	u.RawQuery = q
	return u.String()
}

// StartAgain starts a server stopped with Kill again, on the same data
// directory and port.
func (p *Postgres) StartAgain(t testing.TB) {
	t.Helper()
	os.Remove(filepath.Join(p.Dir, fmt.Sprintf(".s.PGSQL.%d.lock", p.Port)))
	p.start(t)
}

// Restart kills the server with SIGKILL and starts it again on the same
// data directory and port; PostgreSQL runs crash recovery from its WAL.
func (p *Postgres) Restart(t testing.TB) {
	t.Helper()
	p.Kill()
	// The postmaster.pid of a killed server is stale; PostgreSQL checks the
	// PID and removes it, but the socket lock file may linger.
	os.Remove(filepath.Join(p.Dir, fmt.Sprintf(".s.PGSQL.%d.lock", p.Port)))
	p.start(t)
}
