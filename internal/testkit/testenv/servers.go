package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The suite runs the etcd and Redis backends against more than the one
// server version Debian ships: scripts/test.sh builds current servers into a
// cache directory outside the repository and runs those backends' packages
// again with one of these variables naming the directory of a build. When
// a variable is set, its directory must hold the server (a missing binary
// fails the test, as a missing Debian package does); when it is empty, the
// machine's own binaries are used.
const (
	// EtcdDirEnv names a directory holding etcd and etcdctl of one version.
	EtcdDirEnv = "FENCED_ETCD_DIR"
	// RedisDirEnv names a directory holding redis-server or valkey-server
	// (the first found) of one version.
	RedisDirEnv = "FENCED_REDIS_DIR"
)

// serverBinary returns the binary named one of names from the directory
// that env names, or, with env unset, the machine's own (debianPackage
// names the package that installs it).
func serverBinary(t testing.TB, env, debianPackage string, names ...string) string {
	t.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		return RequireBinary(t, debianPackage, names...)
	}
	for _, n := range names {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	t.Fatalf("testenv: %s=%s holds none of %v; scripts/test.sh builds it there", env, dir, names)
	return ""
}

// EtcdBinary returns the etcd server the starters run: the one in the
// directory FENCED_ETCD_DIR names, or Debian's.
func EtcdBinary(t testing.TB) string { return serverBinary(t, EtcdDirEnv, "etcd-server", "etcd") }

// EtcdctlBinary returns the etcdctl of the same version as EtcdBinary.
func EtcdctlBinary(t testing.TB) string { return serverBinary(t, EtcdDirEnv, "etcd-client", "etcdctl") }

// RedisBinary returns the Redis-protocol server the starters run:
// redis-server or valkey-server from the directory FENCED_REDIS_DIR names,
// or Debian's redis-server.
func RedisBinary(t testing.TB) string {
	return serverBinary(t, RedisDirEnv, "redis-server", "redis-server", "valkey-server")
}

// ServerVersion is a server's name and version as its binary reports it.
type ServerVersion struct {
	Name                string // "etcd", "redis" or "valkey"
	Major, Minor, Patch int
}

// String returns "name major.minor.patch".
func (v ServerVersion) String() string {
	return fmt.Sprintf("%s %d.%d.%d", v.Name, v.Major, v.Minor, v.Patch)
}

// AtLeast reports whether v is major.minor or newer.
func (v ServerVersion) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

var (
	versionMu    sync.Mutex
	versionCache = map[string]ServerVersion{}
	// "etcd Version: 3.4.23", "Redis server v=8.6.3 ...",
	// "Valkey server v=9.1.2 ...".
	versionRE = regexp.MustCompile(`(?i)^(etcd|redis|valkey)(?: server v=| version: )(\d+)\.(\d+)\.(\d+)`)
)

// BinaryVersion runs bin --version and parses what it prints. Tests use it
// only to say which behaviour a version is known for; the code under test
// never reads a version.
func BinaryVersion(t testing.TB, bin string) ServerVersion {
	t.Helper()
	versionMu.Lock()
	defer versionMu.Unlock()
	if v, ok := versionCache[bin]; ok {
		return v
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("testenv: %s --version: %v", bin, err)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("testenv: %s --version printed %q, no version found", bin, out)
	}
	atoi := func(b []byte) int { n, _ := strconv.Atoi(string(b)); return n }
	v := ServerVersion{Name: strings.ToLower(string(m[1])), Major: atoi(m[2]), Minor: atoi(m[3]), Patch: atoi(m[4])}
	versionCache[bin] = v
	return v
}

// EtcdVersion returns the version of the etcd the starters run.
func EtcdVersion(t testing.TB) ServerVersion { return BinaryVersion(t, EtcdBinary(t)) }

// RedisVersion returns the name and version of the Redis-protocol server
// the starters run.
func RedisVersion(t testing.TB) ServerVersion { return BinaryVersion(t, RedisBinary(t)) }
