package fencedsqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ErrForeignFile means a name fenced keeps beside the lease file (FILE.lock,
// FILE.wake, FILE.waiters) holds something fenced never makes there. That is
// a symbolic link, a FIFO, a device, a socket, or a directory where a file
// belongs. OpenFile and New refuse such a file with this error, naming the
// path; remove it yourself. fenced neither opens nor removes it: opening a
// FIFO could block every process on the database, and following a link would
// create or lock the file it points to. One that appears after the open is
// not rung (FILE.wake), and a doorbell in FILE.waiters found to be one is
// passed over: waiters then rely on their fallback timers. SQLite's own
// files (FILE-wal, FILE-shm) are SQLite's to check: it does not follow links
// to them either.
//
// Owners are not checked. In a database shared by a group, any of its
// users may have made these files. Fenced only opens them read-only: an
// open is a doorbell's ring, the lock file is only flocked.
var ErrForeignFile = errors.New("not a file fenced makes beside the lease file")

// openBeside opens the file at path, one that fenced keeps beside a lease
// file, read-only (or read-write if rw is set), creating it with mode if
// create is set and it is missing. The open never follows a symbolic link and never blocks; what
// is there is looked at (lstat) before the open, so that neither a FIFO
// nor a device is ever opened, and again (fstat) after it. Anything but a
// regular file is refused with ErrForeignFile naming path. The mode of a
// file it creates is set past the umask, best effort; an existing file's
// mode is left alone.
func openBeside(path string, rw, create bool, mode os.FileMode) (*os.File, error) {
	if err := checkBeside(path, false); err != nil {
		return nil, err
	}
	access := os.O_RDONLY
	if rw {
		access = os.O_RDWR
	}
	flags := access | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_CLOEXEC
	f, err := os.OpenFile(path, flags, 0)
	made := false
	if create && errors.Is(err, fs.ErrNotExist) {
		// O_EXCL: a link made in between is not followed either.
		f, err = os.OpenFile(path, flags|os.O_CREATE|os.O_EXCL, mode)
		made = err == nil
		if errors.Is(err, fs.ErrExist) {
			f, err = os.OpenFile(path, flags, 0) // another process made it
		}
	}
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.EMLINK) {
		// O_NOFOLLOW on a link made after the lstat (EMLINK on BSDs).
		return nil, foreignFile(path, "a symbolic link")
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, foreignFile(path, kindOf(fi.Mode()))
	}
	if made && fi.Mode().Perm() != mode {
		f.Chmod(mode) // best effort, as the umask narrowed it
	}
	return f, nil
}

// checkBeside returns ErrForeignFile naming path if something is at path
// that fenced would not make there: anything but a regular file, or, if
// dir is set, anything but a directory. A missing path is fine, and so is
// one that cannot be looked at (the open that follows reports that).
func checkBeside(path string, dir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil
	}
	m := fi.Mode()
	if dir && m.IsDir() || !dir && m.IsRegular() {
		return nil
	}
	if dir && m.IsRegular() {
		// A file where the doorbells' directory belongs: the doorbells
		// cannot be made, which is no hazard (see queue.makeBellLocked).
		return nil
	}
	return foreignFile(path, kindOf(m))
}

func foreignFile(path, kind string) error {
	return fmt.Errorf("%w: %s is %s; remove it", ErrForeignFile, path, kind)
}

// kindOf names what a file of mode m is, for ErrForeignFile.
func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	}
	return "not a regular file"
}
