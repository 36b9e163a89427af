//go:build !linux

package fencedsqlite

import "errors"

// fileEvents is inotify's on Linux (doorbell_linux.go). Elsewhere there is
// none: newFileEvents fails, no process makes a doorbell of its own, and
// the watcher reads PRAGMA data_version every watchEvery while somebody
// waits.
type fileEvents struct {
	changed chan struct{}
}

func newFileEvents() (*fileEvents, error) {
	return nil, errors.New("no inotify on this platform")
}

func (e *fileEvents) watchShared(doorbell) error                 { return errors.New("no inotify") }
func (e *fileEvents) watchEpisode(string, string) (int32, error) { return 0, errors.New("no inotify") }
func (e *fileEvents) unwatch(int32)                              {}
func (e *fileEvents) take() []string                             { return nil }
func (e *fileEvents) close()                                     {}
