package fencedsqlite

import (
	"errors"
	"os"
)

// doorbellSuffix names the doorbell beside a database file: FILE.wake.
const doorbellSuffix = ".wake"

// doorbell is the file a driver opens (and closes at once) after every
// commit that may have freed a key. The kernel (inotify) tells watchers in
// every process on the host, and they look at the lease table then.
//
// The open comes after the commit has returned. SQLite has then made it
// durable (synchronous FULL: the WAL was synced) and visible (published in
// the WAL index). So a look that follows the event always sees it, however
// long the sync took. Watching the database's own files cannot give that
// order. A WAL commit writes its frames, which the kernel reports, before it
// syncs them. Only then does it publish them in the shared-memory index, a
// mapped file whose writes the kernel does not report. The gap is as long as
// the sync: hundreds of milliseconds on a loaded disk.
//
// The doorbell is opened read-only, so every process that can read the
// database can ring it, and it holds no data. A commit by anything other
// than this driver (the sqlite3 shell) does not ring; waiters then find
// the key free at their fallback timer.
type doorbell struct {
	path string // "" for an in-memory database
	mode os.FileMode
}

// newDoorbell returns the doorbell of the database file dbPath (none for
// ""), creating it with the database file's permissions where it is
// missing. A doorbell that cannot be created (a read-only directory) is
// not an error: ringing it tries again, and until it exists waiters rely
// on their fallback timers. Something other than a regular file there (a
// FIFO, a symbolic link) is: ErrForeignFile (see openBeside).
func newDoorbell(dbPath string) (doorbell, error) {
	if dbPath == "" {
		return doorbell{}, nil
	}
	b := doorbell{path: dbPath + doorbellSuffix, mode: 0o644}
	if fi, err := os.Stat(dbPath); err == nil {
		b.mode = fi.Mode().Perm()
	}
	f, err := openBeside(b.path, false, true, b.mode)
	if errors.Is(err, ErrForeignFile) {
		return doorbell{}, err
	}
	if err == nil {
		f.Close()
	}
	return b, nil
}

// ring tells the watchers that a commit may have freed a key. It never
// blocks and never follows a link (see openBeside): a FIFO or a link put
// there since the driver opened is not rung, and waiters rely on their
// fallback timers.
func (b doorbell) ring() {
	if b.path == "" {
		return
	}
	if f, err := openBeside(b.path, false, true, b.mode); err == nil {
		f.Close()
	}
}
