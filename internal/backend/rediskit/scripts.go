package rediskit

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts of both backends live in lua/, one file each, and only
// there. A script is its file after the files of the local functions it
// calls (held.lua, renew_one.lua), and after a file of its common case
// where it has one (acquire_free.lua, release_free.lua): Redis runs the
// whole script at every call, and a local function costs a closure each
// time its definition runs. KEYS and ARGV are documented at the top
// of each file; every script reads before it writes, so an error (a key of
// the wrong type, a counter that is not a number) leaves nothing changed.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// luaUsed records the files script has read, for the test that every
// file is part of a script.
var luaUsed = map[string]bool{}

// script joins the named files of lua/ into one script, after a flags
// line (Redis 7's "#!lua flags=...") when flags is not empty.
func script(flags string, files ...string) *redis.Script {
	var b strings.Builder
	if flags != "" {
		b.WriteString("#!lua flags=" + flags + "\n")
	}
	for _, f := range files {
		src, err := luaFiles.ReadFile("lua/" + f)
		if err != nil {
			panic("rediskit: " + err.Error()) // embedded at build time
		}
		b.Write(src)
		luaUsed[f] = true
	}
	return redis.NewScript(b.String())
}

// The scripts; see each file for its keys, arguments and reply.
var (
	// Acquire is the redis backend's grant (lua/acquire.lua): a new
	// grant's reply is its fence alone, any other reply {status, fence,
	// pttl} (see ParseAcquire).
	Acquire = script("", "acquire_free.lua", "held.lua", "waiter_queue.lua", "acquire.lua")
	// AcquireNode is Redlock's grant on one node (lua/redlock_acquire.lua).
	AcquireNode = script("", "held.lua", "waiter_queue.lua", "redlock_acquire.lua")
	// Renew renews one grant (lua/renew.lua).
	Renew = script("", "renew.lua")
	// RenewMany renews many grants whose keys share one hash slot
	// (lua/renew_many.lua).
	RenewMany = script("", "renew_one.lua", "renew_many.lua")
	// RenewManyAcross renews many grants of one Cluster node, across its
	// slots (lua/renew_many_across.lua).
	RenewManyAcross = script("allow-cross-slot-keys", "renew_one.lua", "renew_many_across.lua")
	// Release is Redlock's release on one node, which wakes the process
	// first in the node's waiter queue (lua/release.lua).
	Release = script("", "waiter_queue.lua", "release.lua")
	// ReleaseWaiters is the redis backend's release, which wakes the
	// process first in the key's waiter queue, if any
	// (lua/release_waiters.lua, lua/waiter_queue.lua).
	ReleaseWaiters = script("", "release_free.lua", "waiter_queue.lua", "release_waiters.lua")
	// LeaveWaiters ends a process's waiting for a key: it leaves the
	// waiter queue, and wakes the next process if the key is free
	// (lua/leave_waiters.lua).
	LeaveWaiters = script("", "waiter_queue.lua", "leave_waiters.lua")
	// ReleaseAttempt is Redlock's rollback of one failed attempt on one
	// node. It deletes the owner's grant there, unless a later attempt of
	// the owner claimed it (lua/release_attempt.lua).
	ReleaseAttempt = script("", "waiter_queue.lua", "release_attempt.lua")
	// Inspect reads a grant and the fence counter (lua/inspect.lua).
	Inspect = script("", "inspect.lua")
	// Break deletes a grant and records it (lua/break.lua).
	Break = script("", "waiter_queue.lua", "break.lua")
)
