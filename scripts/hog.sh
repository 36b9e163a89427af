#!/usr/bin/env bash
# Loads the machine the way a shared CI runner or a laptop mid-build is
# loaded, to run the suite (or one package's tests) under it:
#
#	scripts/hog.sh ./scripts/test.sh
#	scripts/hog.sh go test -race -count=1 ./fencedetcd -run TestReapAfterOutageInBatches
#	scripts/hog.sh            # until interrupted
#
# The load is HOG_BUSY (default 4) processes spinning on the CPU and one
# build loop: `go build ./...` of this tree into a fresh, temporary build
# cache, again and again (compilers and linkers forking, files written and
# removed; HOG_BUILD=0 turns it off). With a command, the load runs for as
# long as the command does and the script exits with the command's status;
# without one, until it is interrupted. Every process it started ends with
# it: the spinners by their process ids, the build loop by its own process
# group.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/lib/go/bin"

busy=${HOG_BUSY:-4}
build=${HOG_BUILD:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fenced-hog.XXXXXX")
pids=()
group=""

stop() {
	if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi
	if [ -n "$group" ]; then kill -- "-$group" 2>/dev/null || true; fi
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap stop EXIT
trap 'exit 130' INT TERM

for ((i = 0; i < busy; i++)); do
	sh -c 'while :; do :; done' &
	pids+=($!)
done
if [ "$build" != 0 ]; then
	# setsid: the loop leads its own process group, so that ending the
	# group ends the go build (and its compilers) running at the time.
	setsid bash -c '
		n=0
		while :; do
			n=$((n + 1))
			rm -rf "$1/cache"
			GOCACHE="$1/cache" go build ./... >"$1/build.log" 2>&1 || true
			echo "$n" >"$1/builds"
		done' hog-build "$tmp" &
	group=$!
fi
echo "hog.sh: $busy busy processes, build loop $([ "$build" != 0 ] && echo on || echo off)" >&2

if (($#)); then
	# The suite's package timeout only catches a hang; this load makes each
	# package take about three times as long (cmd/fenced and recipe went
	# past 20 minutes under it).
	export FENCED_TEST_TIMEOUT=${FENCED_TEST_TIMEOUT:-60m}
	status=0
	"$@" || status=$?
	echo "hog.sh: $(cat "$tmp/builds" 2>/dev/null || echo 0) cold builds completed alongside" >&2
	exit "$status"
fi
wait
