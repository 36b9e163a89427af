// Package testenv starts real servers for tests, from the machine's own
// binaries, on free loopback ports in temporary directories, and stops them
// when the test ends.
//
// A missing server binary fails the test: the README's test command
// installs every server the suite needs. Set FENCED_ALLOW_MISSING_SERVERS=1
// to turn that failure into a visible skip on a development machine; CI
// never sets it.
package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireBinary returns the path of the first of names found on PATH or in
// extra directories. It fails t when none is found, naming the Debian
// package to install.
func RequireBinary(t testing.TB, debianPackage string, names ...string) string {
	t.Helper()
	if p, ok := FindBinary(names...); ok {
		return p
	}
	msg := fmt.Sprintf("server binary %v not found; install the Debian package %q (the README's test command does)", names, debianPackage)
	if os.Getenv("FENCED_ALLOW_MISSING_SERVERS") == "1" && os.Getenv("CI") == "" {
		t.Skip("SKIPPED, FENCED_ALLOW_MISSING_SERVERS=1: " + msg)
	}
	t.Fatal(msg)
	return ""
}

// FindBinary looks names up on PATH and in the usual Debian locations of
// server binaries that are not on PATH.
func FindBinary(names ...string) (string, bool) {
	dirs := []string{"/usr/sbin", "/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin",
		"/usr/share/zookeeper/bin"}
	for _, n := range names {
		if filepath.IsAbs(n) {
			if _, err := os.Stat(n); err == nil {
				return n, true
			}
			continue
		}
		if p, err := exec.LookPath(n); err == nil {
			return p, true
		}
		for _, d := range dirs {
			p := filepath.Join(d, n)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, true
			}
		}
	}
	return "", false
}

var portMu sync.Mutex
var usedPorts = map[int]bool{}

// FreePort returns a loopback TCP port that was free a moment ago and has
// not been handed out before in this process.
func FreePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 100; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testenv: no free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !usedPorts[p] {
			usedPorts[p] = true
			return p
		}
	}
	t.Fatal("testenv: no unused free port after 100 tries")
	return 0
}

// Process is a server started for a test.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  *SafeBuffer
	Dir  string

	mu     sync.Mutex
	exited chan struct{}
	err    error
	// host, if set, is the network namespace the process runs in
	// (StartOn); WaitPort probes from there.
	host *NetHost
}

// SafeBuffer is a bytes.Buffer safe for concurrent writes and reads.
type SafeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *SafeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SafeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Start runs cmd as a test server named name. Its output is collected (and
// printed if the test fails). It runs in its own process group, and it is
// killed with the group when the test ends. On Linux it is also killed
// when this process dies, even by a panic that runs no cleanup.
func Start(t testing.TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{Name: name, Cmd: cmd, Log: &SafeBuffer{}, Dir: cmd.Dir, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := startTied(cmd); err != nil {
		t.Fatalf("testenv: start %s (%s): %v", name, cmd.Path, err)
	}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, tail(p.Log.String(), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Signal sends sig to the process group. For SIGSTOP it returns once every
// thread of every process of the group shows as stopped, or after 2s. A
// thread in an uninterruptible wait stops only when that ends. A thread
// that was running when the signal came (a PostgreSQL backend, a JVM worker
// thread) may otherwise still answer a request sent just after it.
func (p *Process) Signal(sig syscall.Signal) error {
	pgid := p.Cmd.Process.Pid
	if err := syscall.Kill(-pgid, sig); err != nil || sig != syscall.SIGSTOP {
		return err
	}
	deadline := time.Now().Add(2 * time.Second)
	for !groupStopped(pgid) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return nil
}

// groupStopped reports whether every thread of every process in process
// group pgid is stopped (state T or t in /proc), or gone.
func groupStopped(pgid int) bool {
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return true
	}
	for _, f := range procs {
		st, grp, ok := procStat(f)
		if !ok || grp != pgid || st == 'Z' || st == 'X' {
			continue
		}
		tasks, _ := filepath.Glob(filepath.Join(filepath.Dir(f), "task", "*", "stat"))
		for _, tf := range tasks {
			if st, _, ok := procStat(tf); ok && st != 'T' && st != 't' && st != 'Z' && st != 'X' {
				return false
			}
		}
	}
	return true
}

// procStat reads the state and the process group of a /proc stat file:
// the fields after the command name, which is in parentheses and may
// itself hold any character. ok is false if the file is gone.
func procStat(path string) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:])) // state, ppid, pgrp, ...
	if len(f) < 3 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pgrp, true
}

// Kill kills the process group with SIGKILL. It waits, up to 10s, until the
// leader has exited and no other process of the group is left. A child
// killed in an uninterruptible wait (a PostgreSQL backend inside an fsync)
// dies only when the wait ends. Until then it holds what a restart on the
// same data needs. PostgreSQL refuses to start while the old shared memory
// block is attached.
func (p *Process) Kill() {
	pgid := p.Cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	deadline := time.After(10 * time.Second)
	select {
	case <-p.exited:
	case <-deadline:
		return
	}
	for groupSize(pgid) > 0 {
		select {
		case <-deadline:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// groupSize counts the live processes (not zombies) of process group
// pgid.
func groupSize(pgid int) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range procs {
		if st, grp, ok := procStat(f); ok && grp == pgid && st != 'Z' && st != 'X' {
			n++
		}
	}
	return n
}

// Stop sends SIGTERM and waits up to timeout for a clean exit, then kills.
func (p *Process) Stop(timeout time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.Kill()
	}
}

// WaitPort waits until addr accepts TCP connections, failing t with the
// process's output if it exits first or timeout passes.
func (p *Process) WaitPort(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			t.Fatalf("testenv: %s exited before listening on %s:\n%s", p.Name, addr, tail(p.Log.String(), 4000))
		default:
		}
		if p.host != nil {
			if _, err := p.host.Exchange(addr, ""); err == nil {
				return
			}
		} else if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("testenv: %s not listening on %s after %v:\n%s", p.Name, addr, timeout, tail(p.Log.String(), 4000))
}

// WaitLog waits until the process's output contains substr.
func (p *Process) WaitLog(t testing.TB, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if bytes.Contains([]byte(p.Log.String()), []byte(substr)) {
			return
		}
		select {
		case <-p.exited:
			// The log is complete once the process has exited: look once
			// more, for a line written just before the exit.
			if bytes.Contains([]byte(p.Log.String()), []byte(substr)) {
				return
			}
			t.Fatalf("testenv: %s exited before logging %q:\n%s", p.Name, substr, tail(p.Log.String(), 4000))
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("testenv: %s did not log %q within %v:\n%s", p.Name, substr, timeout, tail(p.Log.String(), 4000))
}

// Addr joins host 127.0.0.1 and port.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Lines splits s into non-empty lines.
func Lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewBufferString(s))
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// RunAsNobody makes cmd run as the "nobody" user when the test runs as
// root, for servers that refuse to run as root (PostgreSQL, MariaDB). dir
// and every path the server writes must be made writable first (see
// ChownNobody).
func RunAsNobody(cmd *exec.Cmd) {
	if os.Geteuid() != 0 {
		return
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
}

// ChownNobody gives paths (recursively) to "nobody" when running as root.
func ChownNobody(t testing.TB, paths ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	for _, root := range paths {
		err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 65534, 65534)
		})
		if err != nil {
			t.Fatalf("testenv: chown %s: %v", root, err)
		}
	}
}

// TempDir returns a temporary directory that "nobody" can use (t.TempDir's
// parents are private to root).
func TempDir(t testing.TB, pattern string) string {
	t.Helper()
	d, err := os.MkdirTemp("", "fenced-"+pattern+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// restartable holds the current process of a server that tests kill and
// start again (Kill, StartAgain), so every server type keeps it the same
// way; it is embedded by MySQL and Postgres.
type restartable struct {
	mu   sync.Mutex
	proc *Process
}

// running records proc as the server's current process.
func (r *restartable) running(proc *Process) {
	r.mu.Lock()
	r.proc = proc
	r.mu.Unlock()
}

// Process returns the server's current process (its process group holds
// every child), for tests that signal the server.
func (r *restartable) Process() *Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// Kill stops the server with SIGKILL (its whole process group), as a crash
// or power cut would. StartAgain brings it back on the same data.
func (r *restartable) Kill() {
	if proc := r.Process(); proc != nil {
		proc.Kill()
	}
}
