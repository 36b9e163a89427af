package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fileEvents reports writes to a database file and its WAL or rollback
// journal, through inotify on their directory (the WAL and journal come
// and go, so the directory is watched, not the files).
type fileEvents struct {
	f       *os.File
	changed chan struct{} // one value, coalesced, per burst of writes
	done    chan struct{}
}

// watchFile starts reporting writes to the main database file of conn. It
// fails for an in-memory database, or when inotify is unavailable.
func watchFile(ctx context.Context, conn *sql.Conn) (*fileEvents, error) {
	var path string
	rows, err := conn.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var seq int
		var name, file string
		if err := rows.Scan(&seq, &name, &file); err != nil {
			rows.Close()
			return nil, err
		}
		if name == "main" {
			path = file
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("in-memory database: no file to watch")
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	dir, base := filepath.Dir(path), filepath.Base(path)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// A non-blocking descriptor in an os.File parks reads in the runtime's
	// poller, and Close wakes them.
	e := &fileEvents{f: os.NewFile(uintptr(fd), "inotify:"+dir), changed: make(chan struct{}, 1), done: make(chan struct{})}
	names := map[string]bool{base: true, base + "-wal": true, base + "-journal": true}
	go e.read(names)
	return e, nil
}

func (e *fileEvents) read(names map[string]bool) {
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
			name := buf[nameAt:end]
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			hit = hit || names[string(name)] || ev.Mask&unix.IN_Q_OVERFLOW != 0
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
