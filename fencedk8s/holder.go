package fencedk8s

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
)

// The leader's name. A fenced lease carries no name, only an owner token
// that must not be shown whole. So the leader also takes a lease on its
// holder key, "<name>/holder/<fence>/<identity>", right after the grant,
// and lets it go when the grant ends; the other candidates find it by
// listing "<name>/holder/<fence>/" once per term (a listing is a scan on
// some backends) and cache what they found.

// A candidate lists a term's holder key at most maxNameLookups times
// before it settles for the owner's prefix, the n-th listing (from 0) no
// sooner than nameBackoff << n after the one before: the leader writes
// the key just after its grant, so the first listings may come too soon.
const (
	maxNameLookups = 6
	nameBackoff    = 25 * time.Millisecond
)

// holderKey returns the key that names the holder of grant fence.
func holderKey(name string, fence uint64, identity string) string {
	return holderPrefix(name, fence) + identity
}

func holderPrefix(name string, fence uint64) string {
	return name + "/holder/" + strconv.FormatUint(fence, 10) + "/"
}

// nameCache is what a candidate found of the current term's leader.
type nameCache struct {
	fence   uint64
	name    string // "" while not found
	lookups int
	last    time.Time // of the last listing
}

// takeHolderKey takes the holder key of l, renewed automatically, and
// releases it when l ends. It is best effort, and runs beside the
// elector: without it the others see the owner's prefix instead of the
// identity.
func (r *ResourceLock) takeHolderKey(l *fenced.Lease) {
	opts := r.opts.Lease
	opts.TTL, opts.ManualRenew, opts.RenewEvery = l.Options().TTL, false, 0
	opts.MinFence = fenced.FenceNone
	ctx, cancel := context.WithTimeout(context.Background(), l.Remaining())
	defer cancel()
	h, err := r.c.TryAcquire(ctx, holderKey(r.name, l.Fence(), r.identity), &opts)
	if err != nil {
		return
	}
	context.AfterFunc(l.Context(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.Remaining())
		defer cancel()
		_ = h.Release(ctx)
	})
}

// holderName returns the name of info's holder: the identity on its holder
// key, or "fenced:" and the owner's prefix until one is found. A holder
// key naming this candidate (another process with the same identity) is
// not believed.
func (r *ResourceLock) holderName(ctx context.Context, info fenced.LeaseInfo) string {
	fallback := "fenced:" + info.Owner
	r.mu.Lock()
	if r.names.fence != info.Fence {
		r.names = nameCache{fence: info.Fence}
	}
	if n := r.names.name; n != "" {
		r.mu.Unlock()
		return n
	}
	if n := r.names.lookups; n >= maxNameLookups || (n > 0 && time.Since(r.names.last) < nameBackoff<<(n-1)) {
		r.mu.Unlock()
		return fallback
	}
	r.names.lookups++
	r.names.last = time.Now()
	r.mu.Unlock()
	prefix := holderPrefix(r.name, info.Fence)
	infos, err := r.c.List(ctx, prefix)
	if err != nil {
		return fallback
	}
	for _, i := range infos {
		id, ok := strings.CutPrefix(i.Key, prefix)
		if !ok || !i.Held || id == "" || id == r.identity {
			continue
		}
		r.mu.Lock()
		if r.names.fence == info.Fence {
			r.names.name = id
		}
		r.mu.Unlock()
		return id
	}
	return fallback
}
