package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// WallClock is a wall clock a test can step for the servers started on it
// (RedisConfig.WallClock, StartPostgresOnClock). Their monotonic clock runs
// on untouched. That is what an NTP step, a VM resumed from a snapshot or
// an operator's `date -s` does to a real host. It is how the tests
// reproduce a clock step at an authority that decides expiry by its wall
// clock (SQL now(), Redis PX).
//
// A server on the clock runs with a small LD_PRELOAD library. It is
// compiled for the test with the machine's C compiler (the one `go test
// -race` needs anyway). It adds the clock's offset to CLOCK_REALTIME (and
// its COARSE and TAI variants), gettimeofday, time and timespec_get.
// CLOCK_MONOTONIC and CLOCK_BOOTTIME pass through. The offset lives in an
// 8-byte file that the library maps shared. So a Step is seen by every
// process of the server (PostgreSQL backends too) at its next clock read.
//
// libfaketime would be the usual tool, but it cannot run Debian's
// redis-server. Its initialisation looks up symbols that glibc no longer
// has, and the failed lookup allocates. The allocation enters jemalloc's
// initialisation, which reads the clock, which re-enters libfaketime's
// initialisation. The server then deadlocks on jemalloc's init lock
// (libfaketime issue #130, open upstream).
type WallClock struct {
	lib, file string
	offset    *int64 // in the shared mapping of file
}

// wallClockC is the preload library. It allocates nothing and resolves
// nothing at run time (the real clocks are read with the clock_gettime
// system call), so it works in any allocator's initialisation.
const wallClockC = `
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t *offset_ns;

static void die(const char *msg) {
	syscall(SYS_write, 2, msg, strlen(msg));
	abort();
}

static int64_t offset(void) {
	int64_t *p = __atomic_load_n(&offset_ns, __ATOMIC_ACQUIRE);
	if (p == NULL) {
		const char *path = getenv("FENCED_WALLCLOCK_FILE");
		if (path == NULL) die("fenced wallclock: FENCED_WALLCLOCK_FILE is not set\n");
		int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) die("fenced wallclock: cannot open FENCED_WALLCLOCK_FILE\n");
		void *m = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
		syscall(SYS_close, fd);
		if (m == MAP_FAILED) die("fenced wallclock: cannot map FENCED_WALLCLOCK_FILE\n");
		int64_t *none = NULL;
		if (!__atomic_compare_exchange_n(&offset_ns, &none, (int64_t *)m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			munmap(m, sizeof(int64_t));
		}
		p = __atomic_load_n(&offset_ns, __ATOMIC_ACQUIRE);
	}
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static int is_wall(clockid_t clk) {
	return clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE || clk == CLOCK_TAI;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
	if (syscall(SYS_clock_gettime, clk, ts) != 0) return -1;
	if (is_wall(clk)) {
		int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
		ts->tv_sec = ns / 1000000000;
		ts->tv_nsec = ns % 1000000000;
		if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000; ts->tv_sec--; }
	}
	return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
	if (tv != NULL) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
	if (tz != NULL) memset(tz, 0, sizeof(struct timezone));
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
	if (t != NULL) *t = ts.tv_sec;
	return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
	if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0) return 0;
	return base;
}
`

// NewWallClock compiles the preload library into a temporary directory
// and returns a clock at offset zero. It fails t if no C compiler is
// installed (Debian package gcc).
func NewWallClock(t testing.TB) *WallClock {
	t.Helper()
	cc := RequireBinary(t, "gcc", "cc", "gcc")
	dir := TempDir(t, "wallclock")
	c := &WallClock{lib: filepath.Join(dir, "wallclock.so"), file: filepath.Join(dir, "offset")}
	src := filepath.Join(dir, "wallclock.c")
	if err := os.WriteFile(src, []byte(wallClockC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror",
		// glibc declares gettimeofday's tv non-null; callers may still pass NULL.
		"-Wno-nonnull-compare", "-fno-delete-null-pointer-checks", "-o", c.lib, src).CombinedOutput(); err != nil {
		t.Fatalf("testenv: compile the wall clock library with %s: %v\n%s", cc, err, out)
	}
	if err := os.WriteFile(c.file, make([]byte, 8), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(c.file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatalf("testenv: map %s: %v", c.file, err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	c.offset = (*int64)(unsafe.Pointer(&mem[0]))
	return c
}

// Step moves the clock by d (forward if positive) for every server on it,
// at once.
func (c *WallClock) Step(d time.Duration) { atomic.AddInt64(c.offset, int64(d)) }

// Offset is how far the clock is from the host's wall clock.
func (c *WallClock) Offset() time.Duration { return time.Duration(atomic.LoadInt64(c.offset)) }

// Now is the time the servers on the clock read now.
func (c *WallClock) Now() time.Time { return time.Now().Add(c.Offset()) }

// Apply makes cmd run on the clock. It adds the preload library and the
// offset file to cmd's environment (the test's environment if cmd.Env is
// nil). A nil clock leaves cmd alone.
func (c *WallClock) Apply(cmd *exec.Cmd) {
	if c == nil {
		return
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	preload := c.lib
	if p := os.Getenv("LD_PRELOAD"); p != "" {
		preload += " " + p
	}
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+preload, "FENCED_WALLCLOCK_FILE="+c.file)
}
