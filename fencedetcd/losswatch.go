package fencedetcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
)

// lossWatches watches the keys of held grants for their deletion, all on
// one long-lived Watch stream of the driver's connection, with one watch
// per key that this type numbers itself. clientv3's Watch starts a
// goroutine per watch, so a client holding a hundred thousand leases would
// run as many goroutines; here a watched grant costs one map entry (and
// the server one watcher).
//
// Each watch starts at the revision after its key's creation, so it also
// sees a deletion that came before the watch was set up. When the stream
// fails, every watch is set up again the same way on a new one. The server
// may cancel a watch because the history it asks for was compacted. The key
// is then read instead, and watched again from then on if it is still the
// grant's.
//
// Requests on the stream are sent under sendMu, which is taken before mu;
// the receiving goroutine takes mu only, never sendMu, so a Send blocked on
// flow control can never wait for the receiver. A watch's stop takes mu
// only: it queues the cancel request for a goroutine of the type's own.
type lossWatches struct {
	conn *grpc.ClientConn
	ctx  context.Context // the driver's; ends the stream on Close
	// get reads key: its KeyValue (nil if absent) and the store's revision.
	get func(ctx context.Context, key string) (*mvccpb.KeyValue, int64, error)

	sendMu sync.Mutex

	mu      sync.Mutex
	stream  pb.Watch_WatchClient
	cancel  context.CancelFunc
	retry   *time.Timer // reopens a failed stream while watches remain
	closed  bool
	nextID  int64
	watches map[int64]*lossWatch
	// cancels are the watches stopped whose cancel requests are still to
	// be sent on stream, by sendCancels while cancelling.
	cancels    []int64
	cancelling bool
}

// lossWatch is one watched key. id and from are guarded by lossWatches.mu.
type lossWatch struct {
	key  string
	rev  int64 // the key's create revision: the grant's fence
	loss *sessionlock.Loss
	id   int64 // the watch's number on the stream
	from int64 // the revision the watch starts at
}

// lossRetry is how long a failed stream waits before it is opened again.
const lossRetry = 500 * time.Millisecond

// add watches e's key from its creation on and reports its deletion to
// loss. It returns the watch's stop function.
func (lw *lossWatches) add(e *entry, loss *sessionlock.Loss) (stop func()) {
	w := &lossWatch{key: e.etcdKey, rev: e.rev, from: e.rev + 1, loss: loss}
	lw.sendMu.Lock()
	defer lw.sendMu.Unlock()
	lw.mu.Lock()
	if lw.closed {
		lw.mu.Unlock()
		return func() { loss.Stop() }
	}
	lw.nextID++
	w.id = lw.nextID
	if lw.watches == nil {
		lw.watches = map[int64]*lossWatch{}
	}
	lw.watches[w.id] = w
	st, fresh := lw.openLocked()
	lw.mu.Unlock()
	if fresh {
		lw.sendAll(st) // w among them
	} else if st != nil {
		lw.sendCreate(st, w)
	}
	return func() { lw.stop(w) }
}

// stop ends w: after it returns, w's loss is never reported. It does not
// wait for the stream: the watch's cancel request is queued for sendCancels.
// So a stop never blocks on a stream whose peer stopped reading. (A
// partition whose connection stays open fills the stream's write quota; a
// Send then waits until gRPC keepalive drops the connection.)
func (lw *lossWatches) stop(w *lossWatch) {
	w.loss.Stop()
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.watches[w.id] != w {
		return
	}
	delete(lw.watches, w.id)
	if lw.stream == nil {
		return // a new stream sets up only the watches left
	}
	lw.cancels = append(lw.cancels, w.id)
	if !lw.cancelling {
		lw.cancelling = true
		go lw.sendCancels()
	}
}

// sendCancels sends the queued cancel requests, until none are left, on
// the goroutine stop starts (one at a time).
func (lw *lossWatches) sendCancels() {
	lw.sendMu.Lock()
	defer lw.sendMu.Unlock()
	for {
		lw.mu.Lock()
		ids, st := lw.cancels, lw.stream
		lw.cancels = nil
		if len(ids) == 0 || st == nil {
			lw.cancelling = false
			lw.mu.Unlock()
			return
		}
		lw.mu.Unlock()
		for _, id := range ids {
			err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
				CancelRequest: &pb.WatchCancelRequest{WatchId: id},
			}})
			if err != nil {
				lw.failed(st) // drops the rest: the next stream has no such watches
				break
			}
		}
	}
}

// openLocked returns the stream, opening one if there is none (fresh then
// reports that no watch is set up on it yet). It returns nil while the
// stream cannot be opened; a reopening is then scheduled.
func (lw *lossWatches) openLocked() (st pb.Watch_WatchClient, fresh bool) {
	if lw.stream != nil {
		return lw.stream, false
	}
	if lw.closed || lw.retry != nil {
		return nil, false
	}
	ctx, cancel := context.WithCancel(lw.ctx)
	st, err := pb.NewWatchClient(lw.conn).Watch(ctx)
	if err != nil {
		cancel()
		lw.scheduleLocked()
		return nil, false
	}
	lw.stream, lw.cancel = st, cancel
	go lw.receive(st)
	return st, true
}

// sendAll sets up every watch on a fresh stream st. The caller holds
// sendMu.
func (lw *lossWatches) sendAll(st pb.Watch_WatchClient) {
	lw.mu.Lock()
	all := make([]*lossWatch, 0, len(lw.watches))
	for _, w := range lw.watches {
		all = append(all, w)
	}
	lw.mu.Unlock()
	for _, w := range all {
		if !lw.sendCreate(st, w) {
			return
		}
	}
}

// sendCreate sets up w on st. The caller holds sendMu. It reports false
// if st failed.
func (lw *lossWatches) sendCreate(st pb.Watch_WatchClient, w *lossWatch) bool {
	lw.mu.Lock()
	if lw.watches[w.id] != w {
		lw.mu.Unlock()
		return true // stopped meanwhile
	}
	req := &pb.WatchCreateRequest{
		Key:           []byte(w.key),
		StartRevision: w.from,
		Filters:       []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT},
		WatchId:       w.id,
	}
	lw.mu.Unlock()
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: req}}); err != nil {
		lw.failed(st)
		return false
	}
	return true
}

// failed drops st if it is still the stream, and schedules a new one.
func (lw *lossWatches) failed(st pb.Watch_WatchClient) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.stream != st {
		return
	}
	lw.cancel()
	lw.stream, lw.cancel = nil, nil
	lw.cancels = nil
	lw.scheduleLocked()
}

func (lw *lossWatches) scheduleLocked() {
	if lw.retry != nil || len(lw.watches) == 0 || lw.closed {
		return
	}
	lw.retry = time.AfterFunc(lossRetry, func() {
		lw.sendMu.Lock()
		defer lw.sendMu.Unlock()
		lw.mu.Lock()
		lw.retry = nil
		var st pb.Watch_WatchClient
		fresh := false
		if len(lw.watches) > 0 {
			st, fresh = lw.openLocked()
		}
		lw.mu.Unlock()
		if fresh {
			lw.sendAll(st)
		}
	})
}

// receive delivers st's events until it fails.
func (lw *lossWatches) receive(st pb.Watch_WatchClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			lw.failed(st)
			return
		}
		lw.mu.Lock()
		current := lw.stream == st
		w := lw.watches[resp.WatchId]
		lw.mu.Unlock()
		if !current {
			return
		}
		if w == nil {
			// Stopped meanwhile (or a refused creation, which names no
			// watch: the server refuses only numbers in use, and this type
			// never uses one twice on a stream).
			continue
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				w.loss.Report(fmt.Errorf("%w: etcd key %s was deleted (broken by an admin, or its session expired)", fenced.ErrLost, w.key))
			}
		}
		if resp.Canceled {
			go lw.recheck(w)
		}
	}
}

// recheck reads the key of w, whose watch the server cancelled, and
// reports it lost if it is gone, or watches it again from the revision
// read, under a new number.
func (lw *lossWatches) recheck(w *lossWatch) {
	for {
		ctx, cancel := context.WithTimeout(lw.ctx, 5*time.Second)
		kv, rev, err := lw.get(ctx, w.key)
		cancel()
		if err == nil {
			if kv == nil || kv.CreateRevision != w.rev {
				w.loss.Report(fmt.Errorf("%w: etcd key %s is gone", fenced.ErrLost, w.key))
				return
			}
			lw.sendMu.Lock()
			defer lw.sendMu.Unlock()
			lw.mu.Lock()
			if lw.watches[w.id] != w {
				lw.mu.Unlock()
				return // stopped meanwhile
			}
			delete(lw.watches, w.id)
			lw.nextID++
			w.id, w.from = lw.nextID, rev+1
			lw.watches[w.id] = w
			st, fresh := lw.openLocked()
			lw.mu.Unlock()
			if fresh {
				lw.sendAll(st)
			} else if st != nil {
				lw.sendCreate(st, w)
			}
			return
		}
		if !sessionlock.Pause(lw.ctx, time.Second) {
			return
		}
	}
}

// close drops the stream and every watch; their owners are told nothing
// (the driver is closing).
func (lw *lossWatches) close() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.closed = true
	if lw.retry != nil {
		lw.retry.Stop()
		lw.retry = nil
	}
	if lw.cancel != nil {
		lw.cancel()
	}
	lw.stream, lw.cancel = nil, nil
	lw.watches = nil
	lw.cancels = nil
}
