package rediskit

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Native is what a server offers, beyond the scripts, to renew a grant
// with one conditional command: SET key value IFEQ value PX ttl (Redis 8.4
// and Valkey 8.1 on). ProbeNative finds out by sending the command, never
// from a version string; the zero value is the scripts.
//
// The release stays a script on every server, though Redis 8.4 has DELEX
// IFEQ and Valkey 9.0 DELIFEQ: a release must find, in the same atomic
// step and one round trip, whether anyone waits for the key (and that the
// waiter queue is fenced's own) and wake the first waiter, which a
// conditional delete cannot. The same release made native with WATCH,
// TYPE and a MULTI around the delete took three round trips, and cost the
// server more CPU per acquire-renew-release cycle than the script (40.8
// against 29.8 µs on Redis 8.6.3, with a p50 of 71 against 48 µs).
type Native struct {
	// SetIfEq: renewal is SET IFEQ.
	SetIfEq bool
}

// String says which path renewal and release take, for a store line.
func (n Native) String() string {
	if n.SetIfEq {
		return "renewal by SET IFEQ, release by script"
	}
	return "renewal by script, release by script"
}

// probeValue is the value the probe compares with: no key fenced writes
// holds it (fenced's values are "fence:owner"), so the probe changes
// nothing.
const probeValue = "\x00fenced-native-probe"

// ProbeNative sends SET IFEQ once, on key (which need not exist; the probe
// never writes it, as no key fenced writes holds probeValue): a server that
// knows it answers nil, one that does not a syntax error for the unknown
// IFEQ. Any other error (the server is unreachable) is returned, with
// nothing decided.
func ProbeNative(ctx context.Context, c redis.UniversalClient, key string) (Native, error) {
	var n Native
	err := c.Do(ctx, "SET", key, probeValue, "IFEQ", probeValue+"-other").Err()
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		n.SetIfEq = true
	case !NotSupported(err):
		return Native{}, err
	}
	return n, nil
}

// NotSupported reports whether err is a server's answer that it does not
// know a command or one of its arguments. A native call that gets it (the
// server was replaced by an older one, as after a failover) goes back to
// the script.
func NotSupported(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := strings.ToLower(re.Error())
	return strings.HasPrefix(msg, "err unknown command") || strings.HasPrefix(msg, "err syntax error") ||
		strings.HasPrefix(msg, "err unknown subcommand")
}

// RenewNative renews the grant holding value on lock for ttlMillis with
// SET IFEQ: true if it held value, false if not.
func RenewNative(ctx context.Context, c redis.UniversalClient, lock, value string, ttlMillis int64) (bool, error) {
	err := c.Do(ctx, "SET", lock, value, "IFEQ", value, "PX", ttlMillis).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}
