#!/usr/bin/env bash
# Runs every benchmark side by side: fenced against redsync, redislock,
# etcd's concurrency.Mutex and go-zookeeper's Lock, and fenced's SQL
# backends, on real servers the run starts itself (the same ones
# scripts/test.sh installs). Writes the raw figures to
# bench/results/<date>-<quick|full>.json and renders docs/benchmarks.md
# with its SVG charts in docs/benchmarks/ (a run of some backends or
# workloads renders docs/benchmarks-partial.md instead, unless --docs is
# given, so the published report keeps every backend).
#
#   ./scripts/bench.sh [--quick] [--only redis,redlock,etcd,zookeeper,postgres,mysql,sqlite]
#       [--workloads uncontended,handover,throughput,renewal] [--leases 10000,100000]
#       [--cpuprofile FILE]   # the suite process's CPU profile (go tool pprof FILE)
#       [--childprofiles DIR] # each child process's CPU profile (go tool pprof DIR/*.pprof)
#   ./scripts/bench.sh --render bench/results/<file>.json [--docs docs/other.md]
#       # only renders a report from a run's figures
#   ./scripts/bench.sh --w5 [--quick] [--only redis,etcd,postgres] [--cells 1024x16,256x4,...]
#       # W5, partitions at scale (BenchmarkPartitionsScale in recipe/):
#       # member processes, P × N = {256,1024,4096} × {4,16,32}; --quick
#       # runs 1024 × 16 only (about 2 minutes), the full grid about 25;
#       # --cells picks cells, PxN.
#       # Writes bench/results/<date>-w5-<quick|full>.md; docs/benchmarks.md
#       # has the figures of the last run, pasted.
#
# --quick takes about 5 minutes on a 2-core machine (renewal with 10 000
# leases); the full run (renewal with 10 000 and 100 000 leases, longer
# windows, more rounds) about an hour. The runner is the Go program in
# bench/suite (its own module, so `go test ./...` never runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/lib/go/bin"
command -v go >/dev/null || { echo "bench.sh: Go is not installed (want go 1.26 or newer)"; exit 1; }

cmdline="./scripts/bench.sh${*:+ $*}"
if [[ " $* " == *" --w5 "* ]]; then
	quick=0 only=redis,etcd,postgres cells=
	while (($#)); do
		case $1 in
		--w5) ;;
		--quick) quick=1 ;;
		--only | --cells)
			(($# >= 2)) || { echo "bench.sh: $1 needs a value"; exit 2; }
			declare "${1#--}=$2"
			shift
			;;
		*) echo "bench.sh: --w5 takes --quick, --only and --cells, not $1"; exit 2 ;;
		esac
		shift
	done
	((quick)) && [[ -z $cells ]] && cells=1024x16
	pattern="BenchmarkPartitionsScale/(${only//,/|})\$"
	mode=full
	((quick)) && mode=quick
	out="bench/results/$(date -u +%Y-%m-%dT%H-%M-%SZ)-w5-$mode.md"
	mkdir -p bench/results
	{
		echo "W5 ($cmdline), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start."
		echo
	} >"$out"
	start=$(date +%s)
	W5_OUT=$(pwd)/$out W5_CELLS=$cells go test -run '^$' -bench "$pattern" -benchtime 1x -timeout 4h ./recipe/ || status=$?
	echo
	cat "$out"
	echo "bench.sh: W5 written to $out in $(($(date +%s) - start))s"
	exit "${status:-0}"
fi
args=()
while (($#)); do
	case $1 in
	--quick) args+=(-quick) ;;
	--only | --workloads | --leases | --render | --docs | --cpuprofile | --childprofiles)
		(($# >= 2)) || { echo "bench.sh: $1 needs a value"; exit 2; }
		args+=("-${1#--}" "$2")
		shift
		;;
	--only=* | --workloads=* | --leases=* | --render=* | --docs=* | --cpuprofile=* | --childprofiles=*) args+=("-${1#--}") ;;
	-h | --help)
		sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) echo "bench.sh: unknown argument $1 (see --help)"; exit 2 ;;
	esac
	shift
done

root=$(pwd)
start=$(date +%s)
bin=$(mktemp -d "${TMPDIR:-/tmp}/fenced-bench.XXXXXX")
trap 'rm -rf "$bin"' EXIT
(cd bench/suite && go build -o "$bin/suite" .)
# The suite renders docs/benchmarks.md whole; its W5 section (between the
# W5 markers, written from a --w5 run) is kept across the render.
w5doc=docs/benchmarks.md
sed -n '/^<!-- W5 begin -->$/,/^<!-- W5 end -->$/p' "$w5doc" >"$bin/w5.md"
"$bin/suite" -results "$root/bench/results" -command "$cmdline" "${args[@]}"
if [[ -s $bin/w5.md ]] && ! grep -q '^<!-- W5 begin -->$' "$w5doc"; then
	{
		echo
		cat "$bin/w5.md"
	} >>"$w5doc"
fi
echo "bench.sh: done in $(($(date +%s) - start))s"
