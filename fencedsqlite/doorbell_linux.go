//go:build linux

package fencedsqlite

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

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

// take returns the keys whose entries were rung since the last take.
func (e *fileEvents) take() (keys []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.fired {
		keys = append(keys, k)
	}
	clear(e.fired)
	return keys
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
				hit = true
				continue
			}
			tag, ok := e.watches[ev.Wd]
			switch {
			case !ok || ev.Mask&(unix.IN_OPEN|unix.IN_CREATE|unix.IN_MOVED_TO) == 0:
			case tag.key != "":
				e.fired[tag.key], hit = true, true
			case string(got) == tag.name:
				hit = true
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
