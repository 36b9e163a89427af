package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// openInvoices opens the lease store and the guarded invoices table of the
// canonical worker on one PostgreSQL database.
func openInvoices(ctx context.Context, url string) (*fenced.Client, *fence.SQL, *sql.DB, error) {
	leases, err := fenced.Open(ctx, url, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		leases.Close()
		return nil, nil, nil, err
	}
	guard, err := fence.NewSQL(db, fence.Postgres, fence.Table{Name: "invoices", Key: "id",
		LeaseKey: func(id any) string { return fmt.Sprint("invoice:", id) }}, &fence.SQLOptions{Hook: leases.Options().Hook})
	if err != nil {
		leases.Close()
		db.Close()
		return nil, nil, nil, err
	}
	return leases, guard, db, nil
}

// childCanonicalWorker runs the canonical worker with a short lease and a
// slow render, announcing the render so that the test can stop the process
// in the middle of it, and prints how the worker ended.
func childCanonicalWorker() int {
	ctx := context.Background()
	leases, guard, db, err := openInvoices(ctx, os.Getenv("PG_URL"))
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer leases.Close()
	defer db.Close()
	render = func(ctx context.Context, id string) ([]byte, error) {
		fmt.Println("RENDERING")
		os.Stdout.Sync()
		time.Sleep(1500 * time.Millisecond)
		return []byte("%PDF paused worker"), nil
	}
	issued, err := issueInvoice(ctx, leases, guard, "inv_72", &fenced.LeaseOptions{TTL: time.Second, MaxWait: 10 * time.Second})
	kind := "OTHER"
	switch {
	case err == nil:
		kind = "NONE"
	case errors.Is(err, fenced.ErrStaleFence):
		kind = "STALE"
	case fenced.IsLost(err):
		kind = "LOST"
	}
	fmt.Printf("OUTCOME issued=%v kind=%s err=%v\n", issued, kind, err)
	return 0
}

// TestCanonicalWorkerPostgres runs the canonical worker of the docs against
// PostgreSQL with a real pause: a worker process is stopped (SIGSTOP) in
// the middle of its work, its lease expires, a second worker issues the
// invoice, and when the first is continued its write is refused (or it
// learns of its loss first and does not write). The invoice is issued
// exactly once, by the second worker.
func TestCanonicalWorkerPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.StartPostgres(t)
	leases, guard, db, err := openInvoices(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer leases.Close()
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE invoices (id text PRIMARY KEY, status text NOT NULL, pdf bytea)`,
		`INSERT INTO invoices (id, status) VALUES ('inv_72', 'due')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := guard.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=canonical-worker", "PG_URL="+pg.URL())
	child := testenv.Start(t, "canonical worker", cmd)
	child.WaitLog(t, "RENDERING", 60*time.Second)
	if err := child.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processState(cmd.Process.Pid) != "T" {
		if time.Now().After(deadline) {
			t.Fatalf("worker not stopped:\n%s", child.Log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}

	issued, err := issueInvoice(ctx, leases, guard, "inv_72", &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 30 * time.Second})
	if err != nil || !issued {
		t.Fatalf("second worker: issued=%v err=%v", issued, err)
	}
	if processState(cmd.Process.Pid) != "T" {
		t.Fatal("the first worker resumed before the second one finished")
	}
	if err := child.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-child.Exited():
	case <-time.After(60 * time.Second):
		t.Fatalf("worker did not finish:\n%s", child.Log.String())
	}
	out := child.Log.String()
	t.Logf("paused worker:\n%s", out)
	if !strings.Contains(out, "OUTCOME issued=false kind=STALE") && !strings.Contains(out, "OUTCOME issued=false kind=LOST") {
		t.Fatalf("paused worker's outcome:\n%s\nwant not issued, refused as stale or stopped by its loss", out)
	}
	var status, pdf string
	if err := db.QueryRow(`SELECT status, convert_from(pdf, 'UTF8') FROM invoices WHERE id = 'inv_72'`).Scan(&status, &pdf); err != nil {
		t.Fatal(err)
	}
	if status != "issued" || pdf != "%PDF inv_72" {
		t.Fatalf("invoice: status %q pdf %q, want issued once, by the second worker", status, pdf)
	}
}

// canonicalRegion returns the lines of example_worker_test.go between the
// marker "// canonical:<name>" and the next "// canonical:end", with the
// indentation of the marker removed.
func canonicalRegion(t *testing.T, name string) string {
	t.Helper()
	src, err := os.ReadFile("example_worker_test.go")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "// canonical:"+name {
			continue
		}
		indent := l[:len(l)-len(strings.TrimLeft(l, "\t"))]
		var out []string
		for _, l := range lines[i+1:] {
			if strings.TrimSpace(l) == "// canonical:end" {
				return strings.TrimRight(strings.Join(out, "\n"), "\n")
			}
			out = append(out, strings.TrimPrefix(l, indent))
		}
	}
	t.Fatalf("no canonical:%s region", name)
	return ""
}

// asDocComment renders code as an indented block of a Go doc comment.
func asDocComment(code string) string {
	lines := strings.Split(code, "\n")
	for i, l := range lines {
		if l == "" {
			lines[i] = "//"
		} else {
			lines[i] = "//\t" + l
		}
	}
	return strings.Join(lines, "\n")
}

// TestCanonicalSnippetInSync (issue 16, item 12): the README, docs/guards.md
// and the package documentation show the very code that
// TestCanonicalWorkerPostgres runs and that compiles in Example_worker.
func TestCanonicalSnippetInSync(t *testing.T) {
	for _, region := range []string{"worker", "setup"} {
		code := canonicalRegion(t, region)
		for _, doc := range []struct{ path, want string }{
			{"../README.md", code},
			{"../docs/guards.md", code},
			{"doc.go", asDocComment(code)},
		} {
			b, err := os.ReadFile(doc.path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), doc.want) {
				t.Errorf("%s does not contain the canonical %s code; copy it from example_worker_test.go:\n%s", doc.path, region, doc.want)
			}
		}
	}
}
