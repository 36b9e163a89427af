package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQL is a MariaDB server started for tests from Debian's mariadb-server
// package. It has its own data directory in a temporary directory, and a
// unix socket there. It listens on TCP on a free loopback port. It has a
// real user with a password: the grant tables are in force, so a wrong
// password is refused.
type MySQL struct {
	// User and Password are the test user's credentials, with every
	// privilege on Database.
	User, Password, Database string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// Dir holds the data directory and the unix socket.
	Dir string

	bin string
	restartable
	// clock is the wall clock the server reads (nil: the host's).
	clock *WallClock
	// host is the Net host the server runs on (nil: loopback).
	host *NetHost
}

// StartMySQL initializes a data directory and starts MariaDB, as user
// "nobody" when the test runs as root. The server is stopped when t ends.
func StartMySQL(t testing.TB) *MySQL {
	t.Helper()
	return StartMySQLOnClock(t, nil)
}

// StartMySQLOnClock is StartMySQL with the server reading clock as its
// wall clock (NOW(), UTC_TIMESTAMP()), also after a restart; a nil clock
// is the host's.
func StartMySQLOnClock(t testing.TB, clock *WallClock) *MySQL {
	t.Helper()
	return startMySQL(t, clock, nil)
}

// StartMySQLOn is StartMySQL with the server on host h of a Net,
// listening on h's address (for partitions at the packet level).
func StartMySQLOn(t testing.TB, h *NetHost) *MySQL {
	t.Helper()
	return startMySQL(t, nil, h)
}

func startMySQL(t testing.TB, clock *WallClock, h *NetHost) *MySQL {
	t.Helper()
	bin := RequireBinary(t, "mariadb-server", "mariadbd", "mysqld")
	installDB := RequireBinary(t, "mariadb-server", "mariadb-install-db", "mysql_install_db")
	dir := TempDir(t, "mariadb")
	m := &MySQL{User: "fenced", Password: "my-secret-" + strconv.Itoa(os.Getpid()), Database: "fenced", Dir: dir, bin: bin, clock: clock,
		host: h}
	ChownNobody(t, dir)
	installMariaDB(t, installDB, dir)
	m.Port = FreePort(t)
	m.start(t)
	t.Cleanup(m.Kill)

	// Root may log in without a password over the socket only; create the
	// test user and database through it.
	db, err := sql.Open("mysql", "root@unix("+m.Socket()+")/")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range []string{
		"CREATE DATABASE " + m.Database,
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", m.User, m.Password),
		fmt.Sprintf("GRANT ALL ON %s.* TO '%s'@'%%'", m.Database, m.User),
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("testenv: mariadb setup %q: %v", q, err)
		}
	}
	return m
}

func (m *MySQL) start(t testing.TB) {
	t.Helper()
	// The server's temporary tables go in a directory of its own, not the
	// shared /tmp: a full suite runs several servers at once, and one of
	// them once failed a statement because its temporary table's file in
	// /tmp was gone when it came to delete it.
	tmp := filepath.Join(m.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o777); err != nil { // the server runs as nobody
		t.Fatal(err)
	}
	cmd := exec.Command(m.bin, "--no-defaults", "--datadir="+filepath.Join(m.Dir, "data"), "--tmpdir="+tmp,
		"--socket="+m.Socket(), "--port="+strconv.Itoa(m.Port), "--bind-address="+hostIP(m.host),
		"--pid-file="+filepath.Join(m.Dir, "mariadb.pid"), "--skip-name-resolve",
		"--innodb-buffer-pool-size=32M", "--innodb-log-file-size=32M", "--max-connections=400",
		"--performance-schema=OFF")
	RunAsNobody(cmd)
	m.clock.Apply(cmd)
	proc := startServer(t, m.host, "mariadbd", cmd)
	// The TCP port opens before the unix socket accepts connections; the
	// server logs (to stderr, without --log-error) when both are ready.
	proc.WaitLog(t, "ready for connections", 60*time.Second)
	proc.WaitPort(t, hostAddr(m.host, m.Port), 60*time.Second)
	m.running(proc)
}

// Socket is the server's unix socket.
func (m *MySQL) Socket() string { return filepath.Join(m.Dir, "mysqld.sock") }

// URL returns a mysql:// URL for the test user with extra query parameters.
func (m *MySQL) URL(params ...string) string { return m.URLAs(m.User, m.Password, params...) }

// URLAs is URL with other credentials.
func (m *MySQL) URLAs(user, password string, params ...string) string {
	u := url.URL{Scheme: "mysql", User: url.UserPassword(user, password), Host: hostAddr(m.host, m.Port), Path: "/" + m.Database}
	q := ""
	for i, s := range params {
		if i > 0 {
			q += "&"
		}
		q += s
	}
	u.RawQuery = q
	return u.String()
}

// DSN returns a go-sql-driver DSN for the test user.
func (m *MySQL) DSN() string {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName = m.User, m.Password, "tcp", hostAddr(m.host, m.Port), m.Database
	return c.FormatDSN()
}

// StartAgain starts a server stopped with Kill again, on the same data
// directory and port.
func (m *MySQL) StartAgain(t testing.TB) {
	t.Helper()
	os.Remove(m.Socket())
	m.start(t)
}

// Restart kills the server with SIGKILL and starts it again on the same
// data directory and port; InnoDB recovers from its redo log.
func (m *MySQL) Restart(t testing.TB) {
	t.Helper()
	m.Kill()
	os.Remove(m.Socket())
	m.start(t)
}

// installMariaDB initializes dir/data. Bootstraps running at the same time
// in several test processes were seen to fail ("Unknown table
// 'mysql.tmp_user_sys'"), so installs are serialized across processes with
// a lock file, and a failed install is retried once on a fresh directory.
func installMariaDB(t testing.TB, installDB, dir string) {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "fenced-mariadb-install.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	var out []byte
	for attempt := 1; attempt <= 2; attempt++ {
		data := filepath.Join(dir, "data")
		os.RemoveAll(data)
		cmd := exec.Command(installDB, "--no-defaults", "--datadir="+data,
			"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve")
		cmd.Dir = dir
		RunAsNobody(cmd)
		if out, err = cmd.CombinedOutput(); err == nil {
			return
		}
		t.Logf("testenv: mariadb-install-db attempt %d: %v", attempt, err)
	}
	t.Fatalf("testenv: mariadb-install-db: %v\n%s", err, out)
}
