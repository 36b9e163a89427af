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

// PgBouncer is a PgBouncer in transaction pooling mode in front of a test
// PostgreSQL, from Debian's pgbouncer package. It serves two databases,
// both the server's "postgres" database. "pooled" has ten server
// connections. "single" has one, so that every client shares one server
// session, which makes session-state hazards deterministic.
type PgBouncer struct {
	Port int
	pg   *Postgres
	proc *Process
}

// Output returns the end of PgBouncer's log, for a failing test to show.
func (b *PgBouncer) Output() string { return tail(b.proc.Log.String(), 4000) }

// StartPgBouncer starts PgBouncer in front of pg, as "nobody" when the test
// runs as root; it is stopped when t ends.
func StartPgBouncer(t testing.TB, pg *Postgres) *PgBouncer {
	t.Helper()
	bin := RequireBinary(t, "pgbouncer", "pgbouncer")
	dir := TempDir(t, "pgbouncer")
	b := &PgBouncer{Port: FreePort(t), pg: pg}
	conf := fmt.Sprintf(`[databases]
pooled = host=127.0.0.1 port=%d dbname=%s pool_size=10
single = host=127.0.0.1 port=%d dbname=%s pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = plain
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 10
ignore_startup_parameters = extra_float_digits
admin_users = %s
`, pg.Port, pg.Database, pg.Port, pg.Database, b.Port, filepath.Join(dir, "users.txt"), pg.User)
	files := map[string]string{
		"pgbouncer.ini": conf,
		"users.txt":     strconv.Quote(pg.User) + " " + strconv.Quote(pg.Password) + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ChownNobody(t, dir)
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	RunAsNobody(cmd)
	b.proc = Start(t, "pgbouncer", cmd)
	b.proc.WaitPort(t, Addr(b.Port), 30*time.Second)
	return b
}

// URL returns a postgres:// URL for database ("pooled" or "single")
// through the pooler, with extra query parameters.
func (b *PgBouncer) URL(database string, params ...string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(b.pg.User, b.pg.Password), Host: Addr(b.Port), Path: "/" + database}
	q := "sslmode=disable"
	for _, s := range params {
		q += "&" + s
	}
	u.RawQuery = q
	return u.String()
}
