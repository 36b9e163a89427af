package fencedredlock

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/redis/go-redis/v9"
)

// ClientFence returns a FenceSource backed by another fenced store. Each
// Next takes and releases a short efficiency lease on key there, and returns
// that grant's fence. So the fences are as strong as that store's (strict
// for SQL, etcd and ZooKeeper). It costs that store's acquire and release
// per Redlock attempt. The source does not own c.
func ClientFence(c *fenced.Client) FenceSource { return &clientFence{c: c} }

type clientFence struct{ c *fenced.Client }

func (f *clientFence) Next(ctx context.Context, key string) (uint64, error) {
	l, err := f.c.Acquire(ctx, key, &fenced.LeaseOptions{
		// Every term is explicit, so c's defaults cannot change them: any
		// fence c's store issues will do (Strength reports which), but a
		// lease that failed open has none, so never fail open.
		TTL: 10 * time.Second, MaxWait: fenced.WaitForever, MinFence: fenced.FenceNone, FailOpen: false, ManualRenew: true,
	})
	if err != nil {
		return 0, err
	}
	fence := l.Fence()
	_ = l.Release(ctx) // if this fails the lease expires; the fence is already issued
	return fence, nil
}

func (f *clientFence) Strength() fenced.FenceStrength { return f.c.Capabilities().Fence }

// CounterFence returns a FenceSource that INCRs a per-key counter on one
// Redis server (a single point of failure outside the Redlock nodes). Its
// strength is FenceRepeatable, for the reasons package redis documents.
func CounterFence(c redis.UniversalClient, prefix string) FenceSource {
	if prefix == "" {
		prefix = rediskit.DefaultPrefix
	}
	return &counterFence{c: c, layout: rediskit.Layout{Prefix: prefix}}
}

type counterFence struct {
	c      redis.UniversalClient
	layout rediskit.Layout
}

func (f *counterFence) Next(ctx context.Context, key string) (uint64, error) {
	n, err := f.c.Incr(ctx, f.layout.Keys(key).Fence+"source").Uint64()
	if err != nil {
		return 0, fmt.Errorf("counter fence %q: %w", key, rediskit.Classify(err, true))
	}
	return n, nil
}

func (f *counterFence) Strength() fenced.FenceStrength { return fenced.FenceRepeatable }
