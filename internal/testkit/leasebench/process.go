package leasebench

import (
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// EnvInt returns the integer in the environment variable name, or def when
// it is unset or not an integer. Benchmarks of many held leases read their
// sizes with it (FENCED_HOLD_LEASES and the like).
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// LiveMemory returns the live heap after two garbage collections, and the
// goroutine stacks in use. The second collection frees what finalizers of
// the first released. It is for the memory a process needs per held lease.
func LiveMemory() (heap, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse
}

// CPUTime returns the CPU time (user and system) this process has used so
// far. It panics if getrusage fails, which it does not on Linux.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
