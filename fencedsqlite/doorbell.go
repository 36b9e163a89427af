package fencedsqlite

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
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

// fileEvents reports rings of doorbells through one inotify instance per
// driver: the shared doorbell, watched through its directory (so that a
// doorbell removed and made again is still heard), and the doorbells of
// this process's entries in waiter queues, each watched as a file (only
// its opens wake this process).
type fileEvents struct {
	fd      int
	f       *os.File
	changed chan struct{} // one value, coalesced, per burst of rings
	done    chan struct{}

	mu      sync.Mutex
	watches map[int32]watchTag
	fired   map[string]bool // keys whose entries were rung since the last take
	shared  bool            // the shared doorbell rang since the last take
	closed  bool            // fd is closed (and its number may be reused)
	hearing bool            // the shared doorbell is watched
}

// watchTag is what a watch reports: a ring of the shared doorbell (name,
// in the watched directory) or of an entry's doorbell for key.
type watchTag struct {
	name string
	key  string
}

// newFileEvents starts an inotify instance with no watches. It fails where
// inotify is unavailable.
func newFileEvents() (*fileEvents, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// A non-blocking descriptor in an os.File parks reads in the runtime's
	// poller, and Close wakes them.
	e := &fileEvents{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), changed: make(chan struct{}, 1),
		done: make(chan struct{}), watches: map[int32]watchTag{}, fired: map[string]bool{}}
	go e.read()
	return e, nil
}

// watchShared adds the rings of b, the shared doorbell, unless they are
// heard already. It fails for an in-memory database, or when the watch
// cannot be added.
func (e *fileEvents) watchShared(b doorbell) error {
	if b.path == "" {
		return errors.New("in-memory database: no file to watch")
	}
	e.mu.Lock()
	hearing := e.hearing
	e.mu.Unlock()
	if hearing {
		return nil
	}
	_, err := e.add(filepath.Dir(b.path), unix.IN_OPEN|unix.IN_CREATE|unix.IN_MOVED_TO, watchTag{name: filepath.Base(b.path)})
	if err == nil {
		e.mu.Lock()
		e.hearing = true
		e.mu.Unlock()
	}
	return err
}

// watchEpisode adds the rings of the doorbell at path, an entry's in key's
// waiter queue, and returns the watch for unwatch.
func (e *fileEvents) watchEpisode(path, key string) (int32, error) {
	return e.add(path, unix.IN_OPEN, watchTag{key: key})
}

func (e *fileEvents) add(path string, mask uint32, tag watchTag) (int32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errors.New("inotify closed")
	}
	wd, err := unix.InotifyAddWatch(e.fd, path, mask)
	if err != nil {
		return 0, err
	}
	e.watches[int32(wd)] = tag
	return int32(wd), nil
}

// unwatch removes the watch wd.
func (e *fileEvents) unwatch(wd int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.watches, wd)
	if !e.closed {
		unix.InotifyRmWatch(e.fd, uint32(wd))
	}
}

// take returns the keys whose entries were rung, and whether the shared
// doorbell rang, since the last take.
func (e *fileEvents) take() (keys []string, shared bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.fired {
		keys = append(keys, k)
	}
	clear(e.fired)
	shared, e.shared = e.shared, false
	return keys, shared
}

func (e *fileEvents) read() {
	defer close(e.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := e.f.Read(buf)
		if err != nil {
			return
		}
		hit := false
		e.mu.Lock()
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
			off = end
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				// Events were lost: every doorbell may have rung.
				for _, tag := range e.watches {
					if tag.key != "" {
						e.fired[tag.key] = true
					}
				}
				e.shared, hit = true, true
				continue
			}
			tag, ok := e.watches[ev.Wd]
			switch {
			case !ok || ev.Mask&(unix.IN_OPEN|unix.IN_CREATE|unix.IN_MOVED_TO) == 0:
			case tag.key != "":
				e.fired[tag.key], hit = true, true
			case string(got) == tag.name:
				e.shared, hit = true, true
			}
		}
		e.mu.Unlock()
		if hit {
			select {
			case e.changed <- struct{}{}:
			default:
			}
		}
	}
}

func (e *fileEvents) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.f.Close()
	<-e.done
}
