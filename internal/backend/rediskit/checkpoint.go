package rediskit

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
)

// checkpointSuffix names a lease key's checkpoint: a hash of the fence
// that wrote it (f) and its value (v), which never expires, in the
// lease's hash slot.
const checkpointSuffix = "}:checkpoint"

// Checkpoint returns the checkpoint key of lease key k.
func (l Layout) Checkpoint(k string) string { return l.Prefix + l.open(k) + k + checkpointSuffix }

// WriteCheckpoint stores value as k's checkpoint if grant g is k's lock
// (lua/checkpoint.lua): the check and the write are one script. It
// reports whether it wrote.
var WriteCheckpoint = script("", "checkpoint.lua")

// RunCheckpoint runs WriteCheckpoint for g on c: true if stored.
func RunCheckpoint(ctx context.Context, c redis.Scripter, l Layout, g driver.Grant, value []byte) (bool, error) {
	n, err := WriteCheckpoint.Run(ctx, c, []string{l.Lock(g.Key), l.Checkpoint(g.Key)},
		Value(g.Fence, g.Owner), strconv.FormatUint(g.Fence, 10), value).Int64()
	return n == 1, err
}

// ReadCheckpoint reads k's checkpoint on c: nil and 0 when there is none.
func ReadCheckpoint(ctx context.Context, c redis.Cmdable, l Layout, k string) ([]byte, uint64, error) {
	vals, err := c.HMGet(ctx, l.Checkpoint(k), "f", "v").Result()
	if err != nil {
		return nil, 0, err
	}
	f, ok := vals[0].(string)
	if !ok {
		return nil, 0, nil
	}
	fence, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		return nil, 0, errors.New("checkpoint fence " + strconv.Quote(f) + " is not a number")
	}
	v, _ := vals[1].(string)
	return []byte(v), fence, nil
}
