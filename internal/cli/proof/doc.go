// Package proof is fenced's fault-injection harness: worker processes, a
// nemesis, a recorded history and a checker, in the manner of Jepsen and
// etcd's robustness suite.
//
// A Run starts W worker processes (the caller's binary re-executed; it must
// call MaybeRunWorker first). Each loops on one or a few keys: acquire (with
// wait), read the protected resource, work, check its lease, append to a
// guarded ledger carrying its fence and send one "invoice" per entry,
// release. The resource is a scratch SQLite file guarded by package fence,
// with either ordering: ClaimFirst (claim the fence in the transaction that
// reads) or WriteOnly (guard only the write). Every invocation and
// completion is appended to history.jsonl with CLOCK_MONOTONIC, comparable
// across the processes of one host.
//
// The nemesis injects one Fault per run, at the same protocol moment every
// time. Faults are named for what they do; each keeps its report id
// (Fault.ID) from the table, used in docs/proof.md and the
// histories. The victim takes an arming file at a point ("before-write")
// and signals itself (SIGSTOP for PauseHolder M1 and ReorderWrites M13,
// SIGKILL for KillHolder M3) or delays its write (DelayWrite M2);
// per-worker TCP proxies cut a worker off (CutHolder M4) or let the
// nemesis SIGSTOP it right after its acquire request left (PauseMidAcquire
// M9); a Server implementation pauses (PauseAuthority M5) or kills and
// restarts (CrashAuthority M6) the authority, or kills and restarts the
// leader of an etcd cluster (CrashLeader M10). For the faults that take a
// lease away behind its holder's back, the holder is held before its write
// while a Failover cuts a Redis replica off and promotes it
// (FailoverReplica M7), a Clock steps the wall clock of one Redlock node
// (StepNodeClock M8) or of the authority (StepAuthorityClock M12), or its
// proxy partitions it from ZooKeeper past its session timeout
// (PartitionPastSession M11), or one worker's clock runs at the wrong
// rate on a store without a server clock (SkewClockRate M14); it writes
// once another worker has. With a
// Config.Partition the workers run on hosts of a private network and M4,
// M9 and M11 cut their links at the packet level instead of in the
// proxies; PartitionMinority (P1) cuts a holder, with one member of a
// 3-member ensemble, from the majority (see partition.go), and
// LoseHolderPackets (M15) drops a share of a holder's packets at random.
//
// Check reads the history and the ledger and reports stale writes
// attempted, refused and accepted, fence regressions and repeats (with the
// backend's declared strength), overlapping holders, duplicate effects,
// porcupine's verdict on the ledger (see linearize.go for the model) and
// recovery time. The checker is believed because, with fencing off, it
// sees the PauseHolder (M1) hazard (TestCheckerSeesHazardWithFencingOff).
//
// RunGen is the generative mode: many keys and leases per worker, a random
// mix of every kind of acquisition (Acquire, TryAcquire, Do, AcquireAll,
// semaphore, election, cancelled mid-way, Break) and a random nemesis
// schedule, all drawn from one seed, judged by CheckGen: fences, no lease
// context live past its local validity on the worker's own clock, no
// grant that no Acquire returned left holding a key, no set reported
// healthy with a lost member. TestGenerativeSlice is its CI slice,
// `scripts/proof.sh --long` its nightly run.
//
// RunGenPartitions is the generative mode of recipe.Partitions: member
// processes of one group under kill -9, SIGSTOP, leave and deploys of
// another partition count while a member of the old count is stopped,
// items routed by hash mod P, judged by CheckGenPartitions: no item held
// by two members at once, no stale write accepted on a partition's row,
// every partition owned again within a bound (TestGenerativePartitions).
//
// `fenced proof --store URL` runs the client-side faults against a user's
// store; scripts/proof.sh runs the full matrix and writes docs/proof.md.
package proof
