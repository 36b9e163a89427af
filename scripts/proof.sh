#!/bin/sh
# Runs fenced's full proof matrix (every backend × fault × fencing on/off) on
# real servers started by the tests, then the incumbents' rows (redsync,
# redislock, etcd concurrency.Mutex, go-zookeeper Lock, from the bench
# modules) and the multi-process proof of recipe.Partitions, and writes docs/proof.md and the timelines in docs/proof/.
# FENCED_PROOF_BACKENDS=sqlite,postgres limits fenced's backends;
# FENCED_PROOF_INCUMBENTS=0 skips the incumbents (their last rows, in
# docs/proof/incumbents-*.json, are kept). Takes tens of minutes on a 2-core
# machine.
set -eu
cd "$(dirname "$0")/.."
FENCED_PROOF_OUT="$(pwd)/docs"
export FENCED_PROOF_OUT
if [ "${FENCED_PROOF_INCUMBENTS:-1}" != 0 ]; then
	(cd bench/redis && go test -count=1 -timeout 1h -run '^TestProofIncumbents$' -v .)
	(cd bench/consensus && go test -count=1 -timeout 1h -run '^TestProofIncumbents$' -v .)
fi
PARTITIONS_PROOF_OUT="$FENCED_PROOF_OUT/proof" PARTITIONS_PROOF_FOR="${PARTITIONS_PROOF_FOR:-3m}" \
	go test -count=1 -timeout 1h -run '^TestPartitionsProof(SQLite|Postgres|Redis|Etcd)$' -v ./recipe/
go test -count=1 -timeout 3h -run '^TestMatrixFull$' -v ./proof/ "$@"
echo "wrote docs/proof.md"
