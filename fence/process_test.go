package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

const childEnv = "FENCED_FENCE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "paused-writer":
		os.Exit(childPausedWriter())
	case "pg-writer":
		os.Exit(childPGWriter())
	case "canonical-worker":
		os.Exit(childCanonicalWorker())
	}
	fmt.Fprintln(os.Stderr, "unknown child mode")
	os.Exit(2)
}

const pauseKey = "invoice:inv_72"

// openShared opens the SQLite file that holds both the lease table and the
// guarded invoice_jobs table, shared by the test and its child process.
func openShared(path string) (*fenced.Client, *fence.SQL, *sql.DB, error) {
	drv, err := fencedsqlite.OpenFile(context.Background(), path, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	c := fenced.NewClient(drv, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	g, err := fence.NewSQL(drv.DB(), fence.SQLite, fence.Table{Name: "invoice_jobs", Key: "job_id"}, nil)
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	return c, g, drv.DB(), nil
}

// childPausedWriter is a worker that takes the lease, claims the job and
// writes, checks that its lease is still valid, and is then stopped by a
// real SIGSTOP (sent to itself, so the pause lands exactly between the
// check and the write) for longer than its lease. When continued, it makes
// the write it had decided on and prints the resource's answer.
func childPausedWriter() int {
	ctx := context.Background()
	c, g, db, err := openShared(os.Getenv("SHARED_DB"))
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer c.Close()
	// No automatic renewal: a renewal is a write, and a process stopped
	// inside an SQLite write transaction holds the file's write lock, which
	// blocks every other process (the lease store and the resource alike)
	// until it is continued. The pause is what makes the lease expire, with
	// or without renewal.
	lease, err := c.Acquire(ctx, pauseKey, &fenced.LeaseOptions{TTL: 2 * time.Second, ManualRenew: true})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	tok := fence.From(lease)
	if r, err := g.Claim(ctx, nil, "inv_72", tok); err != nil || !r.Applied() {
		fmt.Println("ERROR claim", r, err)
		return 1
	}
	r, err := g.Update(ctx, nil, "inv_72", tok, fence.Write{Set: "note = ?", SetArgs: []any{"child-early"}})
	fmt.Printf("EARLY fence=%d outcome=%v err=%v\n", tok.Fence, r.Outcome, err)
	if lease.Err() != nil {
		fmt.Println("ERROR lease already lost before the pause:", lease.Err())
		return 1
	}
	// Keep no SQLite connection open across the pause: an idle connection
	// of a stopped process was seen holding the file's write lock under
	// load, which blocks every other process until it is continued (an
	// availability hazard of sharing one SQLite file, not a safety one).
	db.SetMaxIdleConns(0)
	fmt.Printf("CHECKED lease valid; stopping (open connections: %d)\n", db.Stats().OpenConnections)
	os.Stdout.Sync()
	// The stop must land before the write: StopSelf returns only once the
	// process has been continued. A bare kill(getpid(), SIGSTOP) does not
	// ensure that: the kernel may stop another thread first, and this one
	// ran on into the late write under load, stopping inside its
	// transaction with SQLite's write lock held.
	supervise.StopSelf()
	// Resumed: the lease expired long ago, but this write was already
	// decided on.
	r, err = g.Update(ctx, nil, "inv_72", tok, fence.Write{Set: "note = ?, sends = sends + 1", SetArgs: []any{"child-late"}})
	fmt.Printf("LATE fence=%d outcome=%v current=%d err=%v lease=%v\n", tok.Fence, r.Outcome, r.Current, err, lease.Err())
	return 0
}

// processState returns the state letter of pid from /proc (T = stopped).
func processState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// TestPausedProcessRefused: a worker process stopped by SIGSTOP past its
// lease TTL has its late write refused, while the new holder (this process,
// which only claimed the row before the old holder resumed) writes freely.
func TestPausedProcessRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a worker past its TTL; run without -short")
	}
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared.db")
	leases, g, db, err := openShared(path)
	if err != nil {
		t.Fatal(err)
	}
	defer leases.Close()
	if _, err := db.Exec(`CREATE TABLE invoice_jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, sends INTEGER NOT NULL DEFAULT 0, note TEXT)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO invoice_jobs (job_id, status) VALUES ('inv_72', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=paused-writer", "SHARED_DB="+path)
	child := testenv.Start(t, "paused worker", cmd)
	child.WaitLog(t, "CHECKED lease valid", 30*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for processState(cmd.Process.Pid) != "T" {
		if time.Now().After(deadline) {
			t.Fatalf("child not stopped; state %q\n%s", processState(cmd.Process.Pid), child.Log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}

	// The child is frozen holding a lease it believes valid. The new holder
	// gets the lease once the authority has expired it, and claims the row
	// without writing anything else yet.
	lease, err := leases.Acquire(ctx, pauseKey, &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	tok := fence.From(lease)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.Claim(ctx, tx, "inv_72", tok)
	if err != nil || !r.Applied() {
		t.Fatalf("new holder's claim: %+v %v", r, err)
	}
	var status string
	if err := tx.QueryRow(`SELECT status FROM invoice_jobs WHERE job_id = 'inv_72'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if processState(cmd.Process.Pid) != "T" {
		t.Fatal("child resumed before the claim")
	}

	// Resume the old holder; its late write must be refused.
	if err := child.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-child.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not finish:\n%s", child.Log.String())
	}
	out := child.Log.String()
	wantLate := fmt.Sprintf("LATE fence=%d outcome=stale current=%d err=<nil>", tok.Fence-1, tok.Fence)
	if !strings.Contains(out, "outcome=applied") || !strings.Contains(out, wantLate) {
		t.Fatalf("child output:\n%s\nwant an applied early write and %q", out, wantLate)
	}
	// The new holder writes as many times as it likes with its fence.
	for i := 0; i < 3; i++ {
		r, err := g.Update(ctx, nil, "inv_72", tok, fence.Write{Set: "note = ?, status = 'SENT', sends = sends + 1", SetArgs: []any{fmt.Sprint("new-", i)}})
		if err != nil || !r.Applied() {
			t.Fatalf("new holder's write %d: %+v %v", i, r, err)
		}
	}
	var note string
	var sends int
	var f int64
	if err := db.QueryRow(`SELECT note, sends, fence FROM invoice_jobs WHERE job_id = 'inv_72'`).Scan(&note, &sends, &f); err != nil {
		t.Fatal(err)
	}
	if note != "new-2" || sends != 3 || uint64(f) != tok.Fence {
		t.Fatalf("row: note %q sends %d fence %d; want the new holder's three writes only", note, sends, f)
	}
}

// openPG opens the PostgreSQL lease store and the guarded table shared by
// the test and its child.
func openPG(url string) (*fenced.Client, *fence.SQL, *sql.DB, error) {
	drv, err := fencedpostgres.Open(context.Background(), url)
	if err != nil {
		return nil, nil, nil, err
	}
	c := fenced.NewClient(drv, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	db, err := sql.Open("pgx", url)
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	g, err := fence.NewSQL(db, fence.Postgres, fence.Table{Name: "invoice_jobs", Key: "job_id"}, nil)
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	return c, g, db, nil
}

// childPGWriter holds a renewed lease and writes every few milliseconds,
// without looking at the lease (as if each write had been decided before a
// pause), printing the resource's answer, until the resource refuses it.
func childPGWriter() int {
	ctx := context.Background()
	c, g, db, err := openPG(os.Getenv("PG_URL"))
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer c.Close()
	defer db.Close()
	lease, err := c.Acquire(ctx, pauseKey, &fenced.LeaseOptions{TTL: time.Second})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	tok := fence.From(lease)
	if r, err := g.Claim(ctx, nil, "inv_72", tok); err != nil || !r.Applied() {
		fmt.Println("ERROR claim", r, err)
		return 1
	}
	for i := 0; ; i++ {
		r, err := g.Update(ctx, nil, "inv_72", tok, fence.Write{Set: "note = $1, sends = sends + 1", SetArgs: []any{fmt.Sprint("child-", i)}})
		if err != nil {
			fmt.Println("ERROR write", err)
			return 1
		}
		fmt.Printf("WRITE %d fence=%d outcome=%v current=%d\n", i, tok.Fence, r.Outcome, r.Current)
		if r.Outcome == fence.Stale {
			fmt.Printf("REFUSED lease=%v\n", lease.Err())
			return 0
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPausedProcessRefusedPostgres: a worker whose lease is renewed
// automatically (PostgreSQL lease store) is stopped by SIGSTOP from outside
// at an arbitrary moment while writing in a loop. Its renewals stop with
// it, the lease expires at the authority, this process takes over and
// claims the row; once continued, the worker's very next write is refused,
// and the new holder's writes succeed.
func TestPausedProcessRefusedPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a worker past its TTL; run without -short")
	}
	t.Parallel()
	ctx := context.Background()
	pg := testenv.StartPostgres(t)
	leases, g, db, err := openPG(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer leases.Close()
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE invoice_jobs (job_id text PRIMARY KEY, status text NOT NULL, sends integer NOT NULL DEFAULT 0, note text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO invoice_jobs (job_id, status) VALUES ('inv_72', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=pg-writer", "PG_URL="+pg.URL())
	child := testenv.Start(t, "writing worker", cmd)
	child.WaitLog(t, "WRITE 3 ", 30*time.Second)
	if err := child.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := child.Log.String()

	lease, err := leases.Acquire(ctx, pauseKey, &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	tok := fence.From(lease)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := g.Claim(ctx, tx, "inv_72", tok); err != nil || !r.Applied() {
		t.Fatalf("claim: %+v %v", r, err)
	}
	var sendsAtClaim int
	if err := tx.QueryRow(`SELECT sends FROM invoice_jobs WHERE job_id = 'inv_72'`).Scan(&sendsAtClaim); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if processState(cmd.Process.Pid) != "T" {
		t.Fatalf("child not stopped while the new holder took over (state %q)", processState(cmd.Process.Pid))
	}
	if err := child.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-child.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not finish:\n%s", child.Log.String())
	}
	out := child.Log.String()
	t.Logf("worker output after it was continued:\n%s", strings.TrimPrefix(out, stoppedAt))
	if !strings.Contains(out, fmt.Sprintf("outcome=stale current=%d", tok.Fence)) || !strings.Contains(out, "REFUSED lease=") {
		t.Fatalf("child output:\n%s\nwant its late write refused with current fence %d", out, tok.Fence)
	}
	// No write of the child was applied after the claim: every applied
	// write is counted in sends, and sends has not moved since the claim.
	var sends int
	var f int64
	if err := db.QueryRow(`SELECT sends, fence FROM invoice_jobs WHERE job_id = 'inv_72'`).Scan(&sends, &f); err != nil {
		t.Fatal(err)
	}
	if sends != sendsAtClaim || uint64(f) != tok.Fence {
		t.Fatalf("after the claim: sends %d -> %d, fence %d; output before stop:\n%s", sendsAtClaim, sends, f, stoppedAt)
	}
	for i := 0; i < 3; i++ {
		if r, err := g.Update(ctx, nil, "inv_72", tok, fence.Write{Set: "sends = sends + 1"}); err != nil || !r.Applied() {
			t.Fatalf("new holder's write %d: %+v %v", i, r, err)
		}
	}
}
