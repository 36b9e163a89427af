#!/bin/sh
# Runs fenced's full proof matrix (every backend × fault × fencing on/off) on
# real servers started by the tests, then the incumbents' rows (redsync,
# redislock, etcd concurrency.Mutex, go-zookeeper Lock, from the bench
# modules) and the multi-process proof of recipe.Partitions, and writes docs/proof.md and the timelines in docs/proof/.
# FENCED_PROOF_BACKENDS=sqlite,postgres limits fenced's backends;
# FENCED_PROOF_INCUMBENTS=0 skips the incumbents (their last rows, in
# docs/proof/incumbents-*.json, are kept). Takes tens of minutes on a 2-core
# machine.
#
# scripts/proof.sh --long [duration] [--seed N] runs the nightly-scale
# generative proof instead (hours; not in CI): on SQLite, PostgreSQL, Redis
# and etcd in turn, 3 workers x 8 streams of random operations, up to 10 000
# leases held per worker, faults drawn from the seed, for duration each
# (default 1h), then the partitions row (recipe.Partitions members under
# kills, stops and deploys of another partition count) on SQLite, Redis, PostgreSQL and etcd
# for duration each, and writes their rows into docs/proof.md. A failure
# prints the seed; --seed N reruns it.
set -eu
cd "$(dirname "$0")/.."
FENCED_PROOF_OUT="$(pwd)/docs"
export FENCED_PROOF_OUT
if [ "${1:-}" = --long ]; then
	shift
	FENCED_PROOF_LONG=1h
	case "${1:-}" in
	[0-9]*) FENCED_PROOF_LONG=$1; shift ;;
	esac
	if [ "${1:-}" = --seed ]; then
		FENCED_PROOF_SEED=$2
		export FENCED_PROOF_SEED
		shift 2
	fi
	FENCED_PROOF_PART_DURATION=$FENCED_PROOF_LONG
	export FENCED_PROOF_LONG FENCED_PROOF_PART_DURATION
	exec go test -count=1 -timeout 24h -run '^(TestGenerativeLong|TestGenerativePartitions)$' -v ./internal/cli/proof/ "$@"
fi
if [ "${FENCED_PROOF_INCUMBENTS:-1}" != 0 ]; then
	(cd bench/redis && go test -count=1 -timeout 1h -run '^TestProofIncumbents$' -v .)
	(cd bench/consensus && go test -count=1 -timeout 1h -run '^TestProofIncumbents$' -v .)
fi
# The packet-level rows (network namespaces; needs root), long variant.
FENCED_PROOF_NETNS_OUT="$FENCED_PROOF_OUT/proof/netns.json" FENCED_PROOF_NETNS_LONG=1 \
	go test -count=1 -timeout 1h -run '^TestPacketPartitions$' -v ./internal/cli/proof/
PARTITIONS_PROOF_OUT="$FENCED_PROOF_OUT/proof" PARTITIONS_PROOF_FOR="${PARTITIONS_PROOF_FOR:-3m}" \
	go test -count=1 -timeout 1h -run '^TestPartitionsProof(SQLite|Postgres|Redis|Etcd)$' -v ./recipe/
go test -count=1 -timeout 3h -run '^TestMatrixFull$' -v ./internal/cli/proof/ "$@"
# Clock rate skew on DynamoDB (observed expiry); rewrites its own section.
go test -count=1 -timeout 30m -run '^TestClockRateSkewDynamoDB$' -v ./internal/cli/proof/
echo "wrote docs/proof.md"
