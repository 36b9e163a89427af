package fencedmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedmysql"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// The doorbell tests: a release wakes exactly one sleeping waiter, in
// another driver (as in another process); a holder whose doorbell
// connection is killed, or that is stopped with SIGSTOP while its
// connection holds the doorbell, strands no waiter past its grant's
// expiry; a sleeping waiter whose query is killed, or whose wait is
// cancelled, strands nobody.

// admin is a plain pool on the test server, for the tests' own looks.
func admin(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// sleepers counts the sessions waiting in GET_LOCK on bell.
func sleepers(t *testing.T, db *sql.DB, bell string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE ?`, "SELECT GET_LOCK('"+bell+"'%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// bellHolder returns the connection id holding bell, 0 when free.
func bellHolder(t *testing.T, db *sql.DB, bell string) int64 {
	t.Helper()
	var id sql.NullInt64
	if err := db.QueryRow(`SELECT IS_USED_LOCK(?)`, bell).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id.Int64
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holdWithBell makes d hold key with its doorbell, as a holder that won
// the key while it was contended does, and returns the grant: another
// owner of d takes the key, the waiting acquire takes the free doorbell
// and polls, and wins when the other owner releases.
func holdWithBell(t *testing.T, d *fencedmysql.Driver, key string, ttl time.Duration) driver.Grant {
	t.Helper()
	ctx := ctxT(t)
	first := driver.Grant{Key: key, Owner: "first-" + strconv.FormatInt(time.Now().UnixNano(), 10), TTL: ttl}
	f, err := d.TryAcquire(ctx, key, first.Owner, ttl)
	if err != nil {
		t.Fatal(err)
	}
	first.Fence = f
	type result struct {
		fence uint64
		err   error
	}
	got := make(chan result, 1)
	owner := "holder-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	go func() {
		f, _, err := d.AcquireTimed(ctx, key, owner, ttl)
		got <- result{f, err}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := d.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	return driver.Grant{Key: key, Owner: owner, Fence: r.fence, TTL: ttl}
}

func openOn(t *testing.T, url string) *fencedmysql.Driver {
	t.Helper()
	d, err := fencedmysql.Open(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// stmtExecs is the server's count of prepared statements executed: the
// driver's acquire, renew and release.
func stmtExecs(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var n int64
	if err := db.QueryRow(`SHOW GLOBAL STATUS LIKE 'Com_stmt_execute'`).Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A release wakes one waiter: with five waiters asleep, each in its own
// driver and client, every release costs the store exactly two
// statements on the lease table (the release and the woken waiter's
// grant), and the other waiters stay asleep. Their doorbell waits are
// made a minute long, so only a ring can wake them that fast.
func TestDoorbellWakesOneWaiterPerRelease(t *testing.T) {
	defer fencedmysql.SetMaxBellSleep(time.Minute)()
	srv := testenv.StartMySQL(t) // its own server: nothing else counts
	db := admin(t, srv.DSN())
	ctx := ctxT(t)
	key := "bell:one-per-release"
	d0 := openOn(t, srv.URL())
	bell := fencedmysql.BellName(d0, key)
	g := holdWithBell(t, d0, key, time.Minute)
	if bellHolder(t, db, bell) == 0 {
		t.Fatal("the holder that won a contended key does not hold its doorbell")
	}
	const waiters = 5
	leases := make(chan *fenced.Lease, waiters)
	errs := make(chan error, waiters)
	for range waiters {
		c := fenced.NewClient(openOn(t, srv.URL()), &fenced.Options{MinBackoff: time.Minute, MaxBackoff: time.Minute, FallbackPoll: time.Minute})
		t.Cleanup(func() { c.Close() })
		go func() {
			l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MaxWait: time.Minute})
			if err != nil {
				errs <- err
				return
			}
			leases <- l
		}()
	}
	waitFor(t, "every waiter asleep on the doorbell", 10*time.Second, func() bool { return sleepers(t, db, bell) == waiters })
	release := func() error { return d0.Release(ctx, g) }
	fence := g.Fence
	for i := range waiters {
		before := stmtExecs(t, db)
		start := time.Now()
		if err := release(); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		var l *fenced.Lease
		select {
		case l = <-leases:
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatalf("release %d woke no waiter within 20s", i)
		}
		took := time.Since(start)
		if n := stmtExecs(t, db) - before; n != 2 {
			t.Errorf("handover %d: %d statements on the lease table, want 2 (the release and one waiter's grant)", i, n)
		}
		if l.Fence() <= fence {
			t.Fatalf("handover %d: fence %d after %d", i, l.Fence(), fence)
		}
		fence = l.Fence()
		if left := sleepers(t, db, bell); left != waiters-1-i {
			t.Errorf("after handover %d: %d waiters asleep, want %d", i, left, waiters-1-i)
		}
		if bellHolder(t, db, bell) == 0 {
			t.Errorf("after handover %d: nobody holds the doorbell", i)
		}
		t.Logf("handover %d: %v", i, took.Round(time.Microsecond))
		release = func() error { return l.Release(ctx) }
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if id := bellHolder(t, db, bell); id != 0 {
		t.Errorf("after the last release the doorbell is held by connection %d", id)
	}
}

// A holder whose doorbell connection is killed: the sleeping waiter wakes,
// finds the key held, and polls; the holder's release still succeeds
// (the row is released through the pool) and the waiter gets the key at
// once. A sleeping waiter whose query is killed (KILL QUERY) waits again.
func TestDoorbellConnectionKilled(t *testing.T) {
	defer fencedmysql.SetMaxBellSleep(time.Minute)()
	db := admin(t, my.DSN())
	ctx := ctxT(t)
	key := fmt.Sprintf("bell:killed:%d", time.Now().UnixNano())
	d0 := open(t)
	bell := fencedmysql.BellName(d0, key)
	g := holdWithBell(t, d0, key, time.Minute)
	c1 := fenced.NewClient(open(t), nil)
	t.Cleanup(func() { c1.Close() })
	got := make(chan error, 1)
	var l1 *fenced.Lease
	go func() {
		var err error
		l1, err = c1.Acquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MaxWait: time.Minute})
		got <- err
	}()
	waitFor(t, "the waiter asleep", 10*time.Second, func() bool { return sleepers(t, db, bell) == 1 })

	// KILL QUERY the sleeper: it looks at the row and sleeps again.
	var sleeper int64
	if err := db.QueryRow(`SELECT id FROM information_schema.processlist WHERE info LIKE ?`, "SELECT GET_LOCK('"+bell+"'%").Scan(&sleeper); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`KILL QUERY ?`, sleeper); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	waitFor(t, "the waiter asleep again after KILL QUERY", 10*time.Second, func() bool { return sleepers(t, db, bell) == 1 })

	// Kill the holder's doorbell connection: the server frees the
	// doorbell, the waiter takes it and finds the key still held.
	holder := bellHolder(t, db, bell)
	if holder == 0 {
		t.Fatal("the holder does not hold its doorbell")
	}
	if _, err := db.Exec(`KILL ?`, holder); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter holding the doorbell", 10*time.Second, func() bool {
		id := bellHolder(t, db, bell)
		return id != 0 && id != holder
	})
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the key was held: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	start := time.Now()
	if err := d0.Release(ctx, g); err != nil {
		t.Fatalf("release after the doorbell connection was killed: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter holding the doorbell did not get the released key within 10s")
	}
	t.Logf("key taken %v after the release", time.Since(start).Round(time.Microsecond))
	if l1.Fence() <= g.Fence {
		t.Fatalf("fence %d after %d", l1.Fence(), g.Fence)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if id := bellHolder(t, db, bell); id != 0 {
		t.Errorf("after the last release the doorbell is held by connection %d", id)
	}
}

// A waiter that gives up while asleep (its context ends, and with it its
// connection) strands nobody: the next release wakes another waiter.
func TestDoorbellWaiterGivesUpAsleep(t *testing.T) {
	defer fencedmysql.SetMaxBellSleep(time.Minute)()
	db := admin(t, my.DSN())
	ctx := ctxT(t)
	key := fmt.Sprintf("bell:gives-up:%d", time.Now().UnixNano())
	d0 := open(t)
	bell := fencedmysql.BellName(d0, key)
	g := holdWithBell(t, d0, key, time.Minute)
	quitter, stayer := open(t), open(t)
	qctx, quit := context.WithCancel(ctx)
	quitErr := make(chan error, 1)
	go func() {
		_, _, err := quitter.AcquireTimed(qctx, key, "quitter-owner-0123456789abcdef", time.Minute)
		quitErr <- err
	}()
	waitFor(t, "the first waiter asleep", 10*time.Second, func() bool { return sleepers(t, db, bell) == 1 })
	stayed := make(chan error, 1)
	var fence uint64
	go func() {
		var err error
		fence, _, err = stayer.AcquireTimed(ctx, key, "stayer-owner-0123456789abcdef0", time.Minute)
		stayed <- err
	}()
	waitFor(t, "both waiters asleep", 10*time.Second, func() bool { return sleepers(t, db, bell) == 2 })
	quit()
	if err := <-quitErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %v, want context.Canceled", err)
	}
	if err := d0.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stayed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not reach the waiter that stayed within 10s")
	}
	if err := stayer.Release(ctx, driver.Grant{Key: key, Owner: "stayer-owner-0123456789abcdef0", Fence: fence, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// The child process of TestStoppedBellHolder: it holds the key with its
// doorbell and renews it at a third of its TTL; when it finds its grant
// lost it prints LOST and stays alive (its connections too), so that only
// the driver's ring can free the doorbell.
const envBellHolder = "FENCED_BELLTEST_URL"

func maybeRunBellHolder() {
	url := os.Getenv(envBellHolder)
	if url == "" {
		return
	}
	key := os.Getenv("FENCED_BELLTEST_KEY")
	ttl, _ := time.ParseDuration(os.Getenv("FENCED_BELLTEST_TTL"))
	d, err := fencedmysql.Open(context.Background(), url)
	if err != nil {
		fmt.Println("HOLDER ERROR", err)
		os.Exit(2)
	}
	g := holdWithBellChild(d, key, ttl)
	fmt.Printf("FENCE %d\n", g.Fence)
	for {
		time.Sleep(ttl / 3)
		if err := d.Renew(context.Background(), g); err != nil {
			fmt.Println("LOST", strings.ReplaceAll(err.Error(), "\n", " "))
			time.Sleep(time.Minute)
			os.Exit(3)
		}
	}
}

// testenvHolder is the command that runs the test binary as the child of
// TestStoppedBellHolder.
func testenvHolder(key string, ttl time.Duration) *osexec.Cmd {
	cmd := osexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envBellHolder+"="+my.URL(), "FENCED_BELLTEST_KEY="+key, "FENCED_BELLTEST_TTL="+ttl.String())
	return cmd
}

// holdWithBellChild is holdWithBell without a testing.T.
func holdWithBellChild(d *fencedmysql.Driver, key string, ttl time.Duration) driver.Grant {
	ctx := context.Background()
	first := driver.Grant{Key: key, Owner: "child-first-0123456789abcdef", TTL: ttl}
	f, err := d.TryAcquire(ctx, key, first.Owner, ttl)
	if err != nil {
		fmt.Println("HOLDER ERROR", err)
		os.Exit(2)
	}
	first.Fence = f
	owner := "child-holder-0123456789abcdef"
	type result struct {
		fence uint64
		err   error
	}
	got := make(chan result, 1)
	go func() {
		f, _, err := d.AcquireTimed(ctx, key, owner, ttl)
		got <- result{f, err}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := d.Release(ctx, first); err != nil {
		fmt.Println("HOLDER ERROR", err)
		os.Exit(2)
	}
	r := <-got
	if r.err != nil {
		fmt.Println("HOLDER ERROR", r.err)
		os.Exit(2)
	}
	return driver.Grant{Key: key, Owner: owner, Fence: r.fence, TTL: ttl}
}

// A holder in another process, stopped with SIGSTOP while its connection
// holds the doorbell: its waiters get the key once its grant has expired
// (not later), and each later handover takes no longer than one doorbell
// wait (2 s), not a TTL, although nobody rings. When the holder resumes,
// it finds its grant lost and frees the doorbell.
func TestStoppedBellHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a holder past its TTL; run without -short")
	}
	t.Parallel() // waits on TTLs
	db := admin(t, my.DSN())
	ctx := ctxT(t)
	key := fmt.Sprintf("bell:stopped:%d", time.Now().UnixNano())
	const ttl = 6 * time.Second
	cmd := testenvHolder(key, ttl)
	child := testenv.Start(t, "bell-holder", cmd)
	child.WaitLog(t, "FENCE ", time.Minute)
	var childFence uint64
	for _, line := range testenv.Lines(child.Log.String()) {
		if f, ok := strings.CutPrefix(line, "FENCE "); ok {
			childFence, _ = strconv.ParseUint(f, 10, 64)
		}
	}
	d := open(t)
	bell := fencedmysql.BellName(d, key)
	if bellHolder(t, db, bell) == 0 {
		t.Fatal("the child does not hold the doorbell")
	}
	const waiters = 3
	leases := make(chan *fenced.Lease, waiters)
	errs := make(chan error, waiters)
	for range waiters {
		c := fenced.NewClient(open(t), nil)
		t.Cleanup(func() { c.Close() })
		go func() {
			l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: time.Minute})
			if err != nil {
				errs <- err
				return
			}
			leases <- l
		}()
	}
	// Set-up, not a bound: three clients' first attempts and their sleep
	// on the bell took over 10 s under scripts/hog.sh.
	waitFor(t, "the waiters asleep", time.Minute, func() bool { return sleepers(t, db, bell) == waiters })
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	defer cmd.Process.Signal(syscall.SIGCONT)
	last := stopped
	fence := childFence
	for i := range waiters {
		var l *fenced.Lease
		select {
		case l = <-leases:
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(2 * ttl):
			t.Fatalf("waiter %d: no grant within %v", i, 2*ttl)
		}
		took := time.Since(last)
		switch {
		case i == 0 && took > ttl+2*time.Second:
			t.Errorf("first waiter took the key %v after the holder stopped, want at most its TTL %v (+2s)", took, ttl)
		case i > 0 && took > ttl-time.Second:
			t.Errorf("waiter %d took the key %v after the previous release, want well under a TTL (%v)", i, took, ttl)
		}
		if l.Fence() <= fence {
			t.Fatalf("waiter %d: fence %d after %d", i, l.Fence(), fence)
		}
		fence = l.Fence()
		t.Logf("waiter %d: key taken %v after the stop or the previous release", i, took.Round(time.Millisecond))
		time.Sleep(100 * time.Millisecond)
		last = time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	child.WaitLog(t, "LOST", time.Minute)
	waitFor(t, "the resumed holder frees the doorbell", 10*time.Second, func() bool { return bellHolder(t, db, bell) == 0 })
}

// A grant that its holder neither renews nor releases (a lease object
// dropped without Release) gives up its doorbell once its TTL has passed,
// as the row does.
func TestForgottenGrantFreesDoorbell(t *testing.T) {
	t.Parallel() // waits on a TTL
	db := admin(t, my.DSN())
	key := fmt.Sprintf("bell:forgotten:%d", time.Now().UnixNano())
	d := open(t)
	bell := fencedmysql.BellName(d, key)
	const ttl = time.Second
	holdWithBell(t, d, key, ttl)
	held := time.Now()
	if bellHolder(t, db, bell) == 0 {
		t.Fatal("the holder does not hold its doorbell")
	}
	waitFor(t, "the doorbell freed after the TTL", 5*time.Second, func() bool { return bellHolder(t, db, bell) == 0 })
	if took := time.Since(held); took < ttl-100*time.Millisecond {
		t.Errorf("doorbell freed %v after the grant, before its TTL %v", took, ttl)
	}
}

// Over a caller's pool limited to one connection, doorbells take none of
// it: the waiter polls, the holder's renewals and release go through, and
// the waiter gets the key after the release.
func TestDoorbellsLeaveCallersPoolAlone(t *testing.T) {
	// A doorbell wait would hold the pool's one connection for a minute.
	defer fencedmysql.SetMaxBellSleep(time.Minute)()
	ctx := ctxT(t)
	db, err := sql.Open("mysql", my.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	d, err := fencedmysql.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := fmt.Sprintf("bell:callers-pool:%d", time.Now().UnixNano())
	g := driver.Grant{Key: key, Owner: "holder-owner-0123456789abcdef", TTL: time.Minute}
	if g.Fence, err = d.TryAcquire(ctx, key, g.Owner, g.TTL); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var fence uint64
	go func() {
		var err error
		fence, _, err = d.AcquireTimed(ctx, key, "waiter-owner-0123456789abcdef", time.Minute)
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := d.Renew(rctx, g); err != nil {
		t.Fatalf("renewal while a waiter waits on a one-connection pool: %v", err)
	}
	if err := d.Release(rctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the released key within 10s")
	}
	if fence <= g.Fence {
		t.Fatalf("fence %d after %d", fence, g.Fence)
	}
}
