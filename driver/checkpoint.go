package driver

import "context"

// Checkpointer is implemented by drivers that keep a key's checkpoint: an
// opaque value the key's holder records as its progress, which outlives
// the grant it was recorded under and is read by the key's next holder
// (the shard checkpoint of Kinesis's KCL, which writes it with a
// conditional write on the lease's counter).
type Checkpointer interface {
	// Checkpoint stores value as key g.Key's checkpoint, replacing the
	// previous one, if and only if g is the key's current grant (its owner
	// and fence, not expired), decided by the store in the same atomic
	// operation as the write: a read-then-write is not one. Otherwise it
	// returns an error matching ErrNotHeld and changes nothing, so a late
	// checkpoint from an earlier holder (paused past its TTL, then
	// resumed) never replaces a later holder's. A value longer than 64 KiB
	// is refused with fenced.ErrCheckpointTooLarge; every backend that
	// declares Checkpoint keeps one that large in one record. An empty
	// value is stored as one.
	Checkpoint(ctx context.Context, g Grant, value []byte) error
	// ReadCheckpoint returns key's last stored checkpoint and the fence of
	// the grant that stored it. A key with no checkpoint returns a nil
	// value and fence 0, and no error. Read by the key's holder after its
	// grant, it is the last checkpoint any earlier holder stored: none can
	// store another while the grant stands.
	ReadCheckpoint(ctx context.Context, key string) (value []byte, fence uint64, err error)
}
