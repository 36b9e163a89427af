package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// MainTB is a testing.TB for TestMain. With it a package can start its
// servers once for all of its tests, with the same starters its tests use.
// Cleanups registered on it run (last first) when Close is called. A fatal
// error prints the message, runs the cleanups and exits the test binary
// with status 1.
//
// Only the methods the starters use are implemented; the others panic.
type MainTB struct {
	testing.TB // nil: unimplemented methods panic

	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

// NewMainTB returns a MainTB for use in TestMain.
func NewMainTB() *MainTB { return &MainTB{} }

// Close runs the registered cleanups, last first.
func (m *MainTB) Close() {
	m.mu.Lock()
	cs := m.cleanups
	m.cleanups = nil
	m.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// Cleanup implements testing.TB.
func (m *MainTB) Cleanup(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cleanups = append(m.cleanups, f)
}

// Helper implements testing.TB.
func (m *MainTB) Helper() {}

// Name implements testing.TB.
func (m *MainTB) Name() string { return "TestMain" }

// Context implements testing.TB.
func (m *MainTB) Context() context.Context { return context.Background() }

// Log implements testing.TB.
func (m *MainTB) Log(args ...any) { fmt.Fprintln(os.Stderr, args...) }

// Logf implements testing.TB.
func (m *MainTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// Error implements testing.TB.
func (m *MainTB) Error(args ...any) { m.Log(args...); m.Fail() }

// Errorf implements testing.TB.
func (m *MainTB) Errorf(format string, args ...any) { m.Logf(format, args...); m.Fail() }

// Fail implements testing.TB.
func (m *MainTB) Fail() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failed = true
}

// Failed implements testing.TB.
func (m *MainTB) Failed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed
}

// FailNow implements testing.TB: it runs the cleanups and exits.
func (m *MainTB) FailNow() {
	m.Fail()
	m.Close()
	fmt.Fprintln(os.Stderr, "FAIL: TestMain setup failed")
	os.Exit(1)
}

// Fatal implements testing.TB.
func (m *MainTB) Fatal(args ...any) { m.Log(args...); m.FailNow() }

// Fatalf implements testing.TB.
func (m *MainTB) Fatalf(format string, args ...any) { m.Logf(format, args...); m.FailNow() }

// Skip implements testing.TB. Skipping a whole package's setup is not
// allowed (it would hide a missing server), so it fails instead.
func (m *MainTB) Skip(args ...any) { m.Fatal(append([]any{"setup skipped:"}, args...)...) }

// Skipf implements testing.TB; see Skip.
func (m *MainTB) Skipf(format string, args ...any) { m.Fatalf("setup skipped: "+format, args...) }
