package fencedetcd

import (
	"context"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/fenced-dev/fenced"
)

// kaResult is the server's answer to one keep-alive.
type kaResult struct {
	ttl int64
	err error
}

// keepAliver sends keep-alives on one long-lived LeaseKeepAlive stream,
// on demand. clientv3's KeepAliveOnce opens a stream per call, and its
// KeepAlive sends on its own schedule; the driver needs a keep-alive sent
// at a moment it knows, at the cost of one message. The server answers a
// stream's requests one by one, in order, so replies are matched to waiters
// first in, first out.
type keepAliver struct {
	conn *grpc.ClientConn
	ctx  context.Context // the driver's; ends the stream on Close

	mu      sync.Mutex
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	pending []chan kaResult
}

// send sends a keep-alive for lease id and returns the channel its answer
// arrives on.
func (k *keepAliver) send(id int64) (<-chan kaResult, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stream == nil {
		ctx, cancel := context.WithCancel(k.ctx)
		st, err := pb.NewLeaseClient(k.conn).LeaseKeepAlive(ctx)
		if err != nil {
			cancel()
			return nil, err
		}
		k.stream, k.cancel = st, cancel
		go k.receive(st)
	}
	ch := make(chan kaResult, 1)
	if err := k.stream.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
		k.resetLocked(err)
		return nil, err
	}
	k.pending = append(k.pending, ch)
	return ch, nil
}

// receive delivers the stream's answers until it fails.
func (k *keepAliver) receive(st pb.Lease_LeaseKeepAliveClient) {
	for {
		resp, err := st.Recv()
		k.mu.Lock()
		if k.stream != st {
			k.mu.Unlock()
			return
		}
		if err != nil {
			k.resetLocked(err)
			k.mu.Unlock()
			return
		}
		if len(k.pending) == 0 {
			k.resetLocked(fmt.Errorf("unexpected keep-alive reply for lease %x", resp.ID))
			k.mu.Unlock()
			return
		}
		ch := k.pending[0]
		k.pending = k.pending[1:]
		k.mu.Unlock()
		ch <- kaResult{ttl: resp.TTL}
	}
}

// resetLocked fails every waiter and drops the stream; the next send opens
// a new one.
func (k *keepAliver) resetLocked(err error) {
	for _, ch := range k.pending {
		ch <- kaResult{err: fmt.Errorf("%w: keep-alive stream: %v", fenced.ErrUnavailable, err)}
	}
	k.pending = nil
	if k.cancel != nil {
		k.cancel()
	}
	k.stream, k.cancel = nil, nil
}
