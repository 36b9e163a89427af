#!/usr/bin/env bash
# Builds the current servers that scripts/test.sh runs the etcd and Redis
# backends against, beside the versions Debian bookworm ships, into a cache
# directory outside the repository (one directory a build; testenv takes
# the one FENCED_ETCD_DIR or FENCED_REDIS_DIR names). A build that is
# already there is kept.
#
#   scripts/servers.sh etcd    etcd and etcdctl 3.6 and 3.7, with go build
#                              from the Go module proxy (the test-only
#                              modules in internal/testkit/servers pin them)
#   scripts/servers.sh redis   Redis 8 and Valkey 9 and 8, from Debian's
#                              source packages (upstream tarballs), without
#                              LTO and with libc's malloc (the tests need the
#                              commands, not the speed, and the LTO link was
#                              most of the build), with TLS (the TLS tests)
#
# A Redis or Valkey build is kept by its major version: the suite moves to
# a newer upload of Debian's on a machine without the build.
#
# It prints each directory it made ready as NAME=DIR, one a line, last.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/lib/go/bin"
cache=${FENCED_SERVERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fenced/servers}
mkdir -p "$cache"

# etcd MINOR: builds etcd and etcdctl of the version that
# internal/testkit/servers/etcdMINOR/go.mod pins into $cache/etcd-MINOR.
etcd() {
	local minor=$1 mod="internal/testkit/servers/etcd${1/./}" out="$cache/etcd-$1"
	local want
	want=$(awk '$1 == "go.etcd.io/etcd/server/v3" { sub(/^v/, "", $2); print $2 }' "$mod/go.mod")
	if ! "$out/etcd" --version 2>/dev/null | grep -qx "etcd Version: $want" || [ ! -x "$out/etcdctl" ]; then
		echo "servers.sh: building etcd $want into $out" >&2
		local start=$SECONDS
		(cd "$mod" && GOWORK=off GOFLAGS=-mod=readonly go build -trimpath -o "$out/" ./etcd ./etcdctl)
		echo "servers.sh: etcd $want built in $((SECONDS - start))s" >&2
	fi
	echo "etcd-$minor=$out"
}

# The source packages come from Debian's archive through apt-get with a
# configuration of its own (deb-src lines for the suites that carry the
# versions), so the machine's apt sources are left as they are.
apt_dir="$cache/apt"
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
apt_ready=""
apt_sources() {
	[ -n "$apt_ready" ] && return
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
	local keyring=/usr/share/keyrings/debian-archive-keyring.gpg suite
	: >"$apt_dir/sources.list"
	for suite in experimental sid trixie; do
		echo "deb-src [signed-by=$keyring] http://deb.debian.org/debian $suite main" >>"$apt_dir/sources.list"
	done
	apt-get "${apt_opts[@]}" update -qq >&2
	apt_ready=1
}

# server NAME DIR BINARY SOURCE/SUITE...: builds BINARY from the upstream
# tarball of Debian's source package SOURCE in the first SUITE that has it
# into $cache/DIR.
server() {
	local name=$1 dir=$2 bin=$3 out="$cache/$2"
	shift 3
	if [ ! -x "$out/$bin" ]; then
		apt_sources
		local work start=$SECONDS pkg
		work=$(mktemp -d "$cache/build.XXXXXX")
		for pkg in "$@"; do
			(cd "$work" && apt-get "${apt_opts[@]}" source -qq --tar-only "$pkg" >&2) && break
		done
		local tarball
		tarball=$(ls "$work"/*.orig.tar.* 2>/dev/null) || { echo "servers.sh: no source package for $name in $*" >&2; exit 1; }
		echo "servers.sh: building $name from $(basename "$tarball")" >&2
		mkdir "$work/src"
		tar -xf "$tarball" -C "$work/src" --strip-components=1
		make -C "$work/src/src" -j"$(nproc)" OPTIMIZATION=-O2 MALLOC=libc BUILD_TLS=yes USE_SYSTEMD=no "$bin" \
			>"$work/make.log" 2>&1 || { tail -50 "$work/make.log" >&2; exit 1; }
		mkdir -p "$out.new"
		cp "$work/src/src/$bin" "$out.new/"
		rm -rf "$out" "$work"
		mv "$out.new" "$out"
		echo "servers.sh: $("$out/$bin" --version) built in $((SECONDS - start))s" >&2
	fi
	echo "$dir=$out"
}

case ${1:-} in
etcd)
	etcd 3.7
	etcd 3.6
	;;
redis)
	server "Redis 8" redis-8 redis-server redis/experimental redis/sid
	server "Valkey 9" valkey-9 valkey-server valkey/sid valkey/experimental
	server "Valkey 8" valkey-8 valkey-server valkey/trixie
	;;
*)
	echo "usage: scripts/servers.sh etcd|redis" >&2
	exit 2
	;;
esac
