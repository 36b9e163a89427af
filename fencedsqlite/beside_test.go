package fencedsqlite_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
)

// neverBlocks bounds a call that must not block: an open of a file beside
// the database, or a release. Either takes milliseconds; on the original
// code the blocked call never returned at all, so the bound only has to
// be far above the first and finite.
const neverBlocks = 10 * time.Second

// plant puts a FIFO or a symbolic link at path. A link points into a
// directory of its own, to a file that does not exist (or, for a
// directory's place, to an empty directory), returned as target. The
// FIFO's blocked readers are let go when the test ends.
func plant(t *testing.T, path, kind string, dir bool) (target string) {
	t.Helper()
	switch kind {
	case "fifo":
		if err := syscall.Mkfifo(path, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// A reader blocked in open (the original code) returns once
			// a writer opens.
			if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		})
	case "symlink":
		target = filepath.Join(t.TempDir(), "target")
		if dir {
			if err := os.Mkdir(target, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	}
	return target
}

// openWithin opens the lease file at path in the background and returns
// its error, failing the test if the open has not returned within
// neverBlocks.
func openWithin(t *testing.T, path string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		d, err := fencedsqlite.OpenFile(context.Background(), path, nil)
		if err == nil {
			d.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(neverBlocks):
		t.Fatalf("OpenFile(%s) has not returned after %v: it blocked", path, neverBlocks)
		return nil
	}
}

// A FIFO or a symbolic link in the place of a file fenced keeps beside the
// database (the shared doorbell FILE.wake, the first open's lock
// FILE.lock, the doorbells' directory FILE.waiters) is refused at open,
// at once, with ErrForeignFile naming the path. Nothing is created where
// a link points. Before, a FIFO at FILE.wake blocked every open for ever
// (and with it `fenced run`, which then ignored SIGTERM), and a link made
// fenced create the file it pointed to.
func TestForeignFilesBesideAreRefused(t *testing.T) {
	for _, suffix := range []string{".wake", ".lock", ".waiters"} {
		for _, kind := range []string{"fifo", "symlink"} {
			t.Run(strings.TrimPrefix(suffix, ".")+"-"+kind, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "leases.db")
				side := path + suffix
				target := plant(t, side, kind, suffix == ".waiters")
				err := openWithin(t, path)
				if !errors.Is(err, fencedsqlite.ErrForeignFile) || !strings.Contains(err.Error(), side) {
					t.Errorf("OpenFile with a %s at %s: %v\nwant ErrForeignFile naming the path", kind, side, err)
				}
				if target == "" {
					return
				}
				if suffix == ".waiters" {
					if got, _ := os.ReadDir(target); len(got) != 0 {
						t.Errorf("files made where the link points: %v", got)
					}
				} else if _, err := os.Lstat(target); !os.IsNotExist(err) {
					t.Errorf("the file the link points to was created (%v)", err)
				}
			})
		}
	}
}

// A FIFO or a link put in the place of the shared doorbell after the
// driver opened is not rung: a release returns at once, creates nothing
// where the link points, and still wakes the waiter first in the queue
// (its own doorbell is another file). Before, the release's ring blocked
// on the FIFO for ever.
func TestReleaseRingsNoForeignDoorbell(t *testing.T) {
	for _, kind := range []string{"fifo", "symlink"} {
		t.Run(kind, func(t *testing.T) {
			ctx, path, _, release := heldKey(t)
			s := waketest.Refused(t, ctx, openDriver(t, path), "job")
			if err := os.Remove(path + ".wake"); err != nil {
				t.Fatal(err)
			}
			target := plant(t, path+".wake", kind, false)
			done := make(chan struct{})
			go func() { release(0); close(done) }()
			select {
			case <-done:
			case <-time.After(neverBlocks):
				t.Fatalf("the release has not returned after %v: its ring blocked on the %s", neverBlocks, kind)
			}
			if target != "" {
				if _, err := os.Lstat(target); !os.IsNotExist(err) {
					t.Errorf("the ring created the file the link points to (%v)", err)
				}
			}
			if !waketest.Woken(s, neverBlocks) {
				t.Error("the release did not wake the waiter")
			}
		})
	}
}
