package recipe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
)

// readCheckpoint reads the checkpoint of l's partition, now that l holds
// it: no earlier owner can record another while l stands. A store without
// checkpoints gives nil.
func (g *Partitions) readCheckpoint(ctx context.Context, l *fenced.Lease) ([]byte, error) {
	if !g.c.Capabilities().Checkpoint {
		return nil, nil
	}
	cp, fence, err := g.c.Checkpoint(ctx, l.Key())
	if errors.Is(err, fenced.ErrUnsupported) {
		return nil, nil
	}
	if err == nil && fence > l.Fence() {
		// A later grant recorded it: l lapsed between its grant and
		// this read (a pause), and must not start from its successor's
		// progress.
		return nil, fmt.Errorf("fenced: %s: %w: fence %d was followed by fence %d before its work started",
			l.Key(), fenced.ErrNotHeld, l.Fence(), fence)
	}
	return cp, err
}

// Finish returns a context for the work's last steps once its own context
// has ended with ErrHandedOff or ErrLeft: recording its last checkpoint
// (p.Lease.Checkpoint) and its last fenced writes. The lease is kept until
// the work returns, for at most HandoffGrace from the hand-off (or the
// leave); the context ends then, or when the lease ends (lost, broken,
// expired), or when cancel is called. Before a hand-off or leave it ends
// HandoffGrace from now; for a Partition no member gave, at once. It
// carries ctx's values, not its cancellation.
func (p Partition) Finish(ctx context.Context) (context.Context, context.CancelFunc) {
	until := time.Now()
	if p.g != nil {
		p.g.mu.Lock()
		until = p.o.until
		p.g.mu.Unlock()
		if until.IsZero() {
			until = time.Now().Add(p.g.grace)
		}
	}
	fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	if p.Lease == nil {
		return fctx, cancel
	}
	stop := context.AfterFunc(p.Lease.Context(), cancel)
	return fctx, func() { stop(); cancel() }
}

// overran is a partition whose work outlived HandoffGrace: its lease is
// released without waiting for the work. since is the time since its
// hand-off or leave began.
type overran struct {
	p     int
	o     *ownedPartition
	since time.Duration
}

// overrun returns partition p, owned as o, as overran at now. The caller
// holds g.mu.
func (g *Partitions) overrun(p int, o *ownedPartition, now time.Time) overran {
	return overran{p: p, o: o, since: now.Sub(o.until.Add(-g.grace))}
}

// releaseOverran releases the leases of late and reports each with a
// fenced.EventLost event.
func (g *Partitions) releaseOverran(late []overran) {
	for _, x := range late {
		g.releaseLease(x.o.lease)
		g.emit(PartitionEvent{Kind: fenced.EventLost, Partition: x.p, Fence: x.o.lease.Fence(), HandOff: x.since})
	}
}
