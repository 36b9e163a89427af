package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestStoreURLMistakesAreUsageErrors runs the binary on store URLs with a
// mistake in them: each must exit 64 (usage) naming what was wrong, before
// anything connects (nothing listens on port 1), and never 69 (store
// unavailable, which the cron recipe alerts on). Correct URLs for stores
// that are not running exit 69.
func TestStoreURLMistakesAreUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent", "dir", "x.db")
	for _, tc := range []struct {
		store string
		code  int
		want  string
	}{
		{"sqlite://" + missing, 64, filepath.Dir(missing)},
		{"sqlite:" + missing + "?create=maybe", 64, "create="},
		{"sqlite://" + filepath.Join(dir, "x.db") + "?tabel=x", 64, `unknown parameter "tabel"`},
		{"postgres://u:secret@127.0.0.1:1/db?tabel=x", 64, `unknown parameter "tabel"`},
		{"postgres://u:secret@127.0.0.1:1/db?sslmode=disable&work_mem=1MB", 64, `unknown parameter "work_mem"`},
		{"postgres://u:secret@127.0.0.1:1/db?sslmode=disable&connect_timeout=5&search_path=app&application_name=x&pool_max_conns=4&options=-c%20work_mem%3D1MB", 69, "unavailable"},
		{"postgres://u:secret@127.0.0.1:1/db?sslmode=bogus", 64, "sslmode"},
		{"mysql://u:secret@127.0.0.1:1/db?timeout=notaduration", 64, "timeout"},
		{"dynamodb://127.0.0.1:1/fenced-leases?create=1", 69, "unavailable"},
		{"dynamodb://127.0.0.1:1/a%20b?create=1", 64, `"a b"`},
		{"etcd://127.0.0.1:1?tabel=x", 64, `unknown parameter "tabel"`},
		{"zk://127.0.0.1:1?tabel=x", 64, `"tabel"`},
		{"redis://127.0.0.1:1/0?tabel=x", 64, "tabel"},
		{"redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?tabel=x", 64, "tabel"},
		{"mem:?tabel=x", 64, `"tabel"`},
	} {
		r := cli(t, tc.store, "ls")
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fenced --store %s ls: exit %d, stderr %q; want exit %d and %q", tc.store, r.code, r.stderr, tc.code, tc.want)
		}
		if strings.Contains(r.stderr, "secret") {
			t.Errorf("fenced --store %s ls printed the password: %q", tc.store, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nonexistent")); !os.IsNotExist(err) {
		t.Errorf("a refused SQLite path left its directory behind: %v", err)
	}
}

// TestSQLiteDirectoryIsCreatedOnlyWhenAsked: create=1 makes a missing
// directory, and the default per-user file gets its directory made
// without being asked (that path is fenced's own).
func TestSQLiteDirectoryIsCreatedOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "new", "dir", "x.db")
	if r := cli(t, "sqlite://"+file+"?create=1", "ls"); r.code != 0 {
		t.Fatalf("create=1: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("create=1 did not create the file: %v", err)
	}
	state := filepath.Join(dir, "state") // does not exist yet
	cmd, _, errb := cliCmd(t, "sqlite:", "ls")
	cmd.Env = append(cmd.Env, "XDG_STATE_HOME="+state)
	if err := cmd.Run(); err != nil {
		t.Fatalf("the default store: %v, stderr %q", err, errb.String())
	}
	if _, err := os.Stat(filepath.Join(state, "fenced", "fenced.db")); err != nil {
		t.Fatalf("the default store's file was not created: %v", err)
	}
}

// TestServerSettingMistakesAreUsageErrors: a parameter the SQL drivers
// pass to the server as a setting, which the server refuses, exits 64,
// and the settings the server knows work.
func TestServerSettingMistakesAreUsageErrors(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	my := testenv.StartMySQL(t)
	for _, tc := range []struct {
		store string
		code  int
		want  string
	}{
		{pg.URL("options=-c%20tabel%3Dx"), 64, "tabel"},
		{pg.URL("statement_timeout=soon"), 64, "statement_timeout"},
		{pg.URL("search_path=public", "application_name=fenced-test", "options=-c%20work_mem%3D2MB"), 0, ""},
		{my.URL("tabel=x"), 64, "tabel"},
		{my.URL("sql_mode=%27ANSI_QUOTES%27"), 0, ""},
	} {
		r := cli(t, tc.store, "ls")
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fenced --store %s ls: exit %d, stderr %q; want exit %d and %q", tc.store, r.code, r.stderr, tc.code, tc.want)
		}
	}
}
