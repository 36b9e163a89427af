package fencedzookeeper

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
)

// WatchLoss implements driver.LossWatcher with an exists watch on g's node
// whose event is handed to a function (ExistsWFunc, which internal/zk adds
// to go-zookeeper), so a watched grant costs no goroutine. The watch is set
// again after an event that does not end the grant: the node's data
// changed, or the connection dropped the watch. When it cannot be set, it
// is tried again 200 ms later. The session's expiry reaches it as the
// event of a dropped watch.
func (d *Driver) WatchLoss(g driver.Grant, lost func(error)) (func(), error) {
	e, err := d.grantEntry("watch", g)
	if err != nil {
		return nil, err
	}
	w := &nodeLossWatch{d: d, e: e, loss: sessionlock.NewLoss(lost)}
	w.look()
	return w.stop, nil
}

// nodeLossWatch is the loss watch of one grant's node.
type nodeLossWatch struct {
	d    *Driver
	e    *entry
	loss *sessionlock.Loss

	mu      sync.Mutex
	stopped bool
	retry   *time.Timer
}

// lossRelook is how long a loss watch that could not be set waits before
// it tries again.
const lossRelook = 200 * time.Millisecond

func (w *nodeLossWatch) stop() {
	w.loss.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.retry != nil {
		w.retry.Stop()
	}
}

func (w *nodeLossWatch) lost(why string) {
	w.loss.Report(fmt.Errorf("%w: ZooKeeper node %s %s", fenced.ErrLost, w.e.path, why))
}

const (
	nodeExpired = "is gone: the session expired"
	nodeDeleted = "was deleted (broken by an admin, or its session expired)"
)

// look sets the watch, or reports the loss it finds instead. It runs on
// WatchLoss's caller's goroutine or a timer's, never on the connection's.
func (w *nodeLossWatch) look() {
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped || w.d.ctx.Err() != nil {
		return
	}
	ok, stat, err := w.e.zc.conn.ExistsWFunc(w.e.path, w.event)
	switch {
	case errors.Is(err, zk.ErrSessionExpired):
		w.lost(nodeExpired)
	case err != nil:
		// Disconnected: local validity covers the gap; look again.
		w.later(lossRelook)
	case !ok || stat.Czxid != w.e.czxid:
		w.lost(nodeDeleted)
	}
}

// event handles the watch's event, on the connection's receiving
// goroutine: it must not block, nor call the connection.
func (w *nodeLossWatch) event(ev zk.Event) {
	switch {
	case ev.Type == zk.EventNodeDeleted:
		w.lost(nodeDeleted)
	case errors.Is(ev.Err, zk.ErrSessionExpired):
		w.lost(nodeExpired)
	case ev.Type == zk.EventNotWatching:
		w.later(lossRelook)
	default:
		w.later(0)
	}
}

// later looks again after d, on a timer's goroutine.
func (w *nodeLossWatch) later(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.retry = time.AfterFunc(d, w.look)
	}
}
