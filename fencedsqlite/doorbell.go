package fencedsqlite

import (
	"errors"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
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
// missing. A doorbell that cannot be created is not an error: ringing it
// tries again, and until it exists waiters rely on their fallback timers.
func newDoorbell(dbPath string) doorbell {
	if dbPath == "" {
		return doorbell{}
	}
	b := doorbell{path: dbPath + doorbellSuffix, mode: 0o644}
	if fi, err := os.Stat(dbPath); err == nil {
		b.mode = fi.Mode().Perm()
	}
	if f, err := os.OpenFile(b.path, os.O_RDONLY|os.O_CREATE, b.mode); err == nil {
		if fi, err := f.Stat(); err == nil && fi.Mode().Perm() != b.mode {
			f.Chmod(b.mode) // best effort, as the umask narrowed it
		}
		f.Close()
	}
	return b
}

// ring tells the watchers that a commit may have freed a key.
func (b doorbell) ring() {
	if b.path == "" {
		return
	}
	if f, err := os.OpenFile(b.path, os.O_RDONLY|os.O_CREATE, b.mode); err == nil {
		f.Close()
	}
}

// fileEvents reports rings of a doorbell, through inotify on its
// directory (so that a doorbell removed and made again is still heard).
type fileEvents struct {
	f       *os.File
	changed chan struct{} // one value, coalesced, per burst of rings
	done    chan struct{}
}

// watchDoorbell starts reporting rings of b. It fails for an in-memory
// database, or when inotify is unavailable.
func watchDoorbell(b doorbell) (*fileEvents, error) {
	if b.path == "" {
		return nil, errors.New("in-memory database: no file to watch")
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	dir, base := filepath.Dir(b.path), filepath.Base(b.path)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN|unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// A non-blocking descriptor in an os.File parks reads in the runtime's
	// poller, and Close wakes them.
	e := &fileEvents{f: os.NewFile(uintptr(fd), "inotify:"+dir), changed: make(chan struct{}, 1), done: make(chan struct{})}
	go e.read(base)
	return e, nil
}

func (e *fileEvents) read(name string) {
	defer close(e.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := e.f.Read(buf)
		if err != nil {
			return
		}
		hit := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameAt := off + unix.SizeofInotifyEvent
			end := nameAt + int(ev.Len)
			if end > n {
				break
			}
			got := buf[nameAt:end]
			for len(got) > 0 && got[len(got)-1] == 0 {
				got = got[:len(got)-1]
			}
			hit = hit || string(got) == name || ev.Mask&unix.IN_Q_OVERFLOW != 0
			off = end
		}
		if hit {
			select {
			case e.changed <- struct{}{}:
			default:
			}
		}
	}
}

func (e *fileEvents) close() {
	e.f.Close()
	<-e.done
}
