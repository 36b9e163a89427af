package fencedsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

func TestConformance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	h := drivertest.Harness{
		Open: func(t *testing.T) driver.Driver {
			d, err := fencedsqlite.OpenFile(context.Background(), path, nil)
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		BadURLs: []string{
			"sqlite://host/file.db",
			"sqlite:" + path + "?table=bad-name",
			"sqlite:" + path + "?table=x;drop",
			"sqlite:" + path + "?busy_timeout=soon",
			"sqlite:" + path + "?nosuch=1",
			"sqlite://" + filepath.Join(filepath.Dir(path), "nonexistent", "x.db"),
			"sqlite:" + path + "?create=maybe",
		},
	}
	drivertest.RunConformanceTests(t, h)
	recipetest.RunConformanceTests(t, h)
}

// TestWaiterInAnotherConnectionIsWokenByCommit shows that a waiter on a
// separate connection pool (as another process would have) is woken by the
// holder's release through change detection, although its polling and
// fallback are set to once a minute.
func TestWaiterInAnotherConnectionIsWokenByCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(opts *fenced.Options) *fenced.Client {
		d, err := fencedsqlite.OpenFile(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := fenced.NewClient(d, opts)
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder := open(nil)
	waiter := open(&fenced.Options{MinBackoff: time.Minute, MaxBackoff: time.Minute, FallbackPoll: time.Minute})
	l, err := holder.TryAcquire(ctx, "wake", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := waiter.Acquire(ctx, "wake", &fenced.LeaseOptions{MaxWait: 20 * time.Second})
		if err == nil {
			w.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("waiter in another connection pool not woken by the release")
	}
}

// Issue 38: an open that waited the busy timeout for another process's
// init lock fails with ErrBusy (and ErrUnavailable), naming the lock and
// how long it waited, so that a caller that can wait may open again. The
// lock is taken only to set a file up: here it is not yet.
func TestOpenOfBusyFileIsErrBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	_, err = fencedsqlite.OpenFile(context.Background(), path, &fencedsqlite.Options{BusyTimeout: 200 * time.Millisecond})
	if !errors.Is(err, fencedsqlite.ErrBusy) || !errors.Is(err, fenced.ErrUnavailable) || !strings.Contains(err.Error(), path+".lock") {
		t.Fatalf("open while another process holds the init lock: %v; want ErrBusy and ErrUnavailable naming the lock", err)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	d, err := fencedsqlite.OpenFile(context.Background(), path, &fencedsqlite.Options{BusyTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("open once the lock is free: %v", err)
	}
	d.Close()
}

// Opening a file already set up writes nothing and takes no lock: with
// the init lock held and another connection inside a write transaction,
// it still opens at once, and a held lease reads the same. (Before, every
// open queued on the init lock, each behind the others' waits for the
// write lock: N processes starting together waited N busy timeouts.)
func TestOpenOfSetUpFileTakesNoLock(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "leases.db")
	d, err := fencedsqlite.OpenFile(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(d, nil)
	defer c.Close()
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	writer, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	conn, err := writer.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")
	start := time.Now()
	d2, err := fencedsqlite.OpenFile(ctx, path, &fencedsqlite.Options{BusyTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("open of a set-up file while its init lock and write lock are held: %v (after %v)", err, time.Since(start))
	}
	defer d2.Close()
	info, err := d2.Inspect(ctx, "k")
	if err != nil || !info.Held || info.Fence != l.Fence() {
		t.Fatalf("the held lease through the second open: %+v, %v; want held with fence %d", info, err, l.Fence())
	}
}
