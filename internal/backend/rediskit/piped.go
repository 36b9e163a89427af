package rediskit

import "sync/atomic"

// PipedScripts counts the scripts this process's redis drivers sent
// through their pipeline: calls that found others in flight on their
// client. The generative proof reads it to show its Redis row ran the
// pipeline under the nemesis.
var PipedScripts atomic.Int64
