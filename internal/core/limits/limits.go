// Package limits holds the sizes the lease contract bounds. The root,
// the backends, the guards and the conformance suite share them; users
// read them in the docs of the calls that refuse what exceeds them.
package limits

// MaxKeyLen is the longest key accepted, in bytes (fenced.ValidateKey).
const MaxKeyLen = 256

// MaxCheckpoint is the largest checkpoint a backend stores, in bytes (64
// KiB). Every backend that keeps checkpoints holds one that large in one
// record: a MySQL BLOB's limit, far below etcd's request limit, DynamoDB's
// item and ZooKeeper's node. A checkpoint is a position, not the data.
const MaxCheckpoint = 64 << 10

// MaxFenceFloor is the highest fence floor a store accepts (2^61). It
// leaves 2^61 grants above the highest floor on every store. MySQL's reply
// encoding needs fences below 2^62; every SQL column holds 2^63−1.
const MaxFenceFloor uint64 = 1 << 61

// MaxPartitions is the largest partition count of a group. The recipe
// package refuses more with a constant of its own (it imports nothing
// internal); recipe's TestLimitsAgree ties the two.
const MaxPartitions = 4096

// MaxPermits is the largest number of permits of a semaphore, tied to the
// recipe package's own constant the same way.
const MaxPermits = 1024
