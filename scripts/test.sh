#!/usr/bin/env bash
# Runs fenced's whole test suite against real servers.
#
# On a fresh Debian machine it first installs, with apt-get, the server
# packages the tests start themselves (PostgreSQL, MariaDB, Redis, etcd,
# ZooKeeper, Curator and the Python peers), gcc (for cgo and a test
# helper that steps a server's clock) and Node.js with npm. It needs root
# or sudo for that, and only for that. With npm it installs dynalite (a
# DynamoDB-compatible server, pinned) into a cache directory outside the
# repository, and the pinned staticcheck with `go install` into another.
# scripts/servers.sh builds current etcd, Redis and Valkey servers into a
# third (Redis and Valkey with make, from Debian's source packages).
# Extra arguments go to `go test` (for example -run).
# FENCED_TEST_TIMEOUT (default 20m) is each test binary's -timeout, which
# only catches a hang: scripts/hog.sh sets it higher, as its load makes
# every package run about three times as long.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/lib/go/bin"
test_timeout=${FENCED_TEST_TIMEOUT:-20m}

missing=()
need() { # need PACKAGE TEST-COMMAND...
	local pkg=$1
	shift
	if ! "$@" >/dev/null 2>&1; then
		missing+=("$pkg")
	fi
}
need postgresql bash -c 'ls /usr/lib/postgresql/*/bin/postgres'
need mariadb-server test -x /usr/sbin/mariadbd
need pgbouncer test -x /usr/sbin/pgbouncer
need redis-server command -v redis-server
need etcd-server command -v etcd
need etcd-client command -v etcdctl
need zookeeper test -f /usr/share/java/zookeeper.jar
need libcurator-recipes-java test -f /usr/share/java/curator-recipes.jar
need default-jdk-headless command -v javac
need python3-redis /usr/bin/python3 -I -c 'import redis' # -I: not the repo's redis/ directory
need curl command -v curl # fence: the documented shell-child request is run as written
need chromium command -v chromium # cmd/fenced drives the dashboard of fenced serve in headless Chromium (chromedp)
need gcc command -v gcc # testenv.WallClock compiles its clock-stepping preload library (and -race needs cgo)
need make command -v make # scripts/servers.sh builds Redis and Valkey from their source packages
need xz-utils command -v xz # Valkey 8's source package is a .tar.xz
need libssl-dev test -f /usr/include/openssl/ssl.h # scripts/servers.sh builds Redis and Valkey with TLS (the TLS tests)
need strace command -v strace # sqlite: delays the releasing process's fsync (a pure-Go process that no LD_PRELOAD library sees)
need nodejs command -v node # runs dynalite, the DynamoDB-compatible server of the dynamodb tests
need npm command -v npm

if ((${#missing[@]})); then
	echo "test.sh: installing missing Debian packages: ${missing[*]}"
	sudo=""
	if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/fenced-apt.log 2>&1 ||
		{ tail -50 /tmp/fenced-apt.log; exit 1; }
fi

# dynalite (npm, pinned; keep in step with testenv.DynaliteVersion) goes
# into a cache directory outside the repository, where testenv finds it.
dynalite_version=4.0.0
dynalite_dir=${FENCED_DYNALITE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fenced/dynalite}
if ! grep -qs "\"version\": \"$dynalite_version\"" "$dynalite_dir/node_modules/dynalite/package.json"; then
	echo "test.sh: installing dynalite@$dynalite_version into $dynalite_dir"
	mkdir -p "$dynalite_dir"
	npm install --prefix "$dynalite_dir" --no-audit --no-fund --save-exact "dynalite@$dynalite_version" >/tmp/fenced-npm.log 2>&1 ||
		{ tail -50 /tmp/fenced-npm.log; exit 1; }
fi

command -v go >/dev/null || { echo "test.sh: Go is not installed (want go 1.26 or newer)"; exit 1; }

# The etcd and Redis backends run again against current servers, beside
# Debian's etcd 3.4 and Redis 7.0: etcd 3.6 and 3.7, built with go build from
# the module proxy, and Redis 8 and Valkey 9 and 8, built from Debian's
# source packages (scripts/servers.sh; built once into a cache directory
# outside the repository). The builds and then the packages' tests run in a
# background job while the steps below go on; their output follows the
# core's tests.
versions_etcd="./fencedetcd"
versions_redis="./fencedredis ./fence/redisfence ./internal/backend/rediskit"
versions_redis_guard="./fence"
versions() { # versions etcd|redis DIRS GO-TEST-ARGS... (DIRS: what servers.sh printed)
	local kind=$1 dirs=$2 line name dir rc=0 start=$SECONDS
	shift 2
	for line in $dirs; do
		name=${line%%=*} dir=${line#*=}
		if [ "$kind" = etcd ]; then
			echo "test.sh: go test -race against $("$dir/etcd" --version | head -1) ($name)"
			FENCED_ETCD_DIR=$dir go test -race -trimpath -count=1 -timeout "$test_timeout" "$@" $versions_etcd || rc=1
		else
			echo "test.sh: go test -race against $("$dir"/*-server --version) ($name)"
			FENCED_REDIS_DIR=$dir go test -race -trimpath -count=1 -timeout "$test_timeout" "$@" $versions_redis || rc=1
			FENCED_REDIS_DIR=$dir go test -race -trimpath -count=1 -timeout "$test_timeout" -run 'Redis' "$@" $versions_redis_guard || rc=1
			# The generative slice: its renewals take the native path there.
			FENCED_REDIS_DIR=$dir FENCED_PROOF_BACKENDS=redis go test -race -trimpath -count=1 -timeout "$test_timeout" -run 'TestGenerativeSlice' \
				"$@" ./internal/cli/proof || rc=1
		fi
	done
	echo "test.sh: $kind versions done after $((SECONDS - start))s"
	return $rc
}
versions_etcd_log=$(mktemp)
versions_redis_log=$(mktemp)
versions_etcd_rc=$(mktemp)
redis_dirs=$(mktemp)
trap 'rm -f "$versions_etcd_log" "$versions_redis_log" "$versions_etcd_rc" "$redis_dirs"' EXIT
# Both kinds build at once, at the start; their tests run one kind after
# the other, in one background job. On 2 cores, the core's go test -p 4,
# the nested modules' and two version stages at once made a load of 15-23,
# and tests starved.
(
	start=$SECONDS
	./scripts/servers.sh redis >"$redis_dirs" 2>"$versions_redis_log" &
	redis_build=$!
	rc=0
	if dirs=$(./scripts/servers.sh etcd 2>"$versions_etcd_log"); then
		echo "test.sh: etcd builds ready after $((SECONDS - start))s" >>"$versions_etcd_log"
		versions etcd "$dirs" "$@" >>"$versions_etcd_log" 2>&1 || rc=1
	else
		rc=1
	fi
	echo "$rc" >"$versions_etcd_rc"
	wait "$redis_build" || exit 1
	echo "test.sh: redis builds ready after $((SECONDS - start))s" >>"$versions_redis_log"
	versions redis "$(cat "$redis_dirs")" "$@" >>"$versions_redis_log" 2>&1
) &
versions_pid=$!

echo "test.sh: gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:"; echo "$unformatted"; exit 1
fi
# The nested modules (fencedk8s: client-go stays out of the core module's
# go.mod) build against this working tree's core module through the Go
# workspace .ci/go.work, never through a published version; each step below
# runs on them too. in_nested runs a command in each nested module.
nested_modules=(fencedk8s)
workspace="$PWD/.ci/go.work"
in_nested() {
	local m
	for m in "${nested_modules[@]}"; do
		(cd "$m" && GOWORK="$workspace" "$@")
	done
}

echo "test.sh: go vet"
# In the build configuration of internal/testkit/moduletest's scratch module
# (CGO_ENABLED=0, -trimpath: build cache entries that do not depend on
# where a module's files are): the dependencies vet compiles here are the
# ones that test builds from a fresh module cache, so they compile once.
CGO_ENABLED=0 go vet -trimpath ./...
CGO_ENABLED=0 in_nested go vet -trimpath ./...
# The darwin build and staticcheck run in the background, beside the
# tests, which spend most of their time waiting on servers, TTLs and child
# processes; their output follows the tests'. On a new machine each
# compiles the world in a configuration of its own: in the foreground they
# kept the tests from starting for minutes (ci1: 26 minutes from an empty
# cache, vet and the race build included).
lint() {
	# The library builds on macOS and the BSDs too (the embedded SQLite
	# backend polls there instead of inotify); the CLI's supervisor and
	# the proof harness are Linux-only.
	echo "test.sh: go build on darwin (library packages)"
	GOOS=darwin go build $(go list ./... | grep -v -e '/cmd/fenced$' -e '/internal/cli/supervise$' -e '/internal/cli/proof$')
	GOOS=darwin in_nested go build ./...
	# staticcheck (pinned) goes into a cache directory outside the
	# repository. Every check is on: the tree is clean under all of them,
	# so there is no staticcheck.conf to narrow them.
	local staticcheck_version=v0.8.2 # staticcheck 2026.2.2
	local staticcheck_dir=${FENCED_STATICCHECK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fenced/staticcheck-$staticcheck_version}
	if [ ! -x "$staticcheck_dir/staticcheck" ]; then
		echo "test.sh: installing staticcheck@$staticcheck_version into $staticcheck_dir"
		GOBIN="$staticcheck_dir" go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
	fi
	echo "test.sh: staticcheck -checks all"
	# It reads the dependencies from export data that go list -export
	# compiles: in vet's configuration, so that they are vet's compiles.
	CGO_ENABLED=0 GOFLAGS=-trimpath "$staticcheck_dir/staticcheck" -checks all $(go list ./...)
	CGO_ENABLED=0 GOFLAGS=-trimpath in_nested "$staticcheck_dir/staticcheck" -checks all ./...
}
lint_log=$(mktemp)
trap 'rm -f "$lint_log" "$versions_etcd_log" "$versions_redis_log" "$versions_etcd_rc" "$redis_dirs"' EXIT
lint >"$lint_log" 2>&1 &
lint_pid=$!
echo "test.sh: go test -race"
# -trimpath (here, in the nested modules' and in the version stages'):
# without it a package's compile records the clone's directory, so each
# fresh clone (as CI's) compiled every package of this module again with
# -race (ci12: 144 CPU-seconds of compile and 110 of link on 2 cores).
# The nested modules' tests run beside the core's (two go test commands at
# once share the cores as one would); their output follows the core's.
nested_log=$(mktemp)
trap 'rm -f "$nested_log" "$lint_log" "$versions_etcd_log" "$versions_redis_log" "$versions_etcd_rc" "$redis_dirs"' EXIT
in_nested go test -race -trimpath -count=1 -timeout "$test_timeout" "$@" ./... >"$nested_log" 2>&1 &
nested_pid=$!
# The three longest packages go first: go test starts packages in the order
# it is given them, -p at a time, so a long one started last runs on alone
# after the rest are done. -p 4 on 2 cores: the tests spend most of their
# time waiting on servers, TTLs and child processes (a quiet run with -p 2
# used 14 of its 35 CPU-minutes), and they must hold on a busy machine anyway.
first="./internal/cli/proof ./cmd/fenced ./recipe"
rest=$(go list ./... | grep -v -e '/internal/cli/proof$' -e '/cmd/fenced$' -e '/recipe$')
core_rc=0
go test -race -trimpath -count=1 -p 4 -timeout "$test_timeout" "$@" $first $rest || core_rc=$?
nested_rc=0
wait "$nested_pid" || nested_rc=$?
echo "test.sh: go test -race (nested modules: ${nested_modules[*]})"
cat "$nested_log"
lint_rc=0
wait "$lint_pid" || lint_rc=$?
echo "test.sh: the darwin build and staticcheck (beside the tests)"
cat "$lint_log"
versions_rc=0
wait "$versions_pid" || versions_rc=$?
[ "$(cat "$versions_etcd_rc")" = 0 ] || versions_rc=1
echo "test.sh: the etcd backend against current etcd"
cat "$versions_etcd_log"
echo "test.sh: the Redis backend and guard against Redis 8 and Valkey"
cat "$versions_redis_log"
exit $((core_rc || nested_rc || lint_rc || versions_rc))
