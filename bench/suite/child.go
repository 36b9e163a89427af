package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

// spawnSpec is what a child process needs to open a backend's
// implementations itself: the name of the set of implementations
// (implSets) and its arguments (server addresses, a store URL).
type spawnSpec struct {
	Set  string   `json:"set"`
	Args []string `json:"args"`
	// Impl is the implementation the child opens.
	Impl string `json:"impl,omitempty"`
}

// implSets build a backend's implementations from its spawnSpec's
// arguments, in a child process as in the suite.
var implSets = map[string]func(args []string) []impl{
	"redis":     redisImpls,
	"redlock":   redlockImpls,
	"etcd":      etcdImpls,
	"zookeeper": zookeeperImpls,
	"fenced":    fencedImpls,
}

// childFlag is the flag that makes the suite a child: one process of one
// implementation, driven over its standard input and output.
const childFlag = "-child"

// childProfileEnv names the directory where each child writes its CPU
// profile, as IMPL-PID.pprof (set by -childprofiles).
const childProfileEnv = "FENCED_BENCH_CHILD_PROFILES"

// runChild is the suite as a child process (spec is a JSON spawnSpec). It
// opens the implementation once and serves, one line each:
//
//	L <key>  -> G <unix ns the lock returned>   (or E <error>)
//	U        -> R <unix ns just before unlock>  (or E <error>)
//
// Times are the wall clock, which every process of the machine shares.
func runChild(spec string) error {
	var sp spawnSpec
	if err := json.Unmarshal([]byte(spec), &sp); err != nil {
		return fmt.Errorf("child spec: %w", err)
	}
	build, ok := implSets[sp.Set]
	if !ok {
		return fmt.Errorf("child spec: unknown set %q", sp.Set)
	}
	var im *impl
	for _, x := range build(sp.Args) {
		if x.name == sp.Impl {
			im = &x
			break
		}
	}
	if im == nil {
		return fmt.Errorf("child spec: no implementation %q in %s", sp.Impl, sp.Set)
	}
	if dir := os.Getenv(childProfileEnv); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", sp.Impl, os.Getpid())))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	p, err := im.open(ctx)
	if err != nil {
		return err
	}
	defer p.close()
	l, err := p.worker()
	if err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	reply := func(format string, a ...any) {
		fmt.Fprintf(out, format+"\n", a...)
		out.Flush()
	}
	var unlock func(context.Context) error
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "L":
			u, err := l.lock(ctx, arg)
			t := time.Now()
			if err != nil {
				reply("E %s", oneLine(err))
				continue
			}
			unlock = u
			reply("G %d", t.UnixNano())
		case "U":
			if unlock == nil {
				reply("E unlock without a lock")
				continue
			}
			t := time.Now()
			err := unlock(ctx)
			unlock = nil
			if err != nil {
				reply("E %s", oneLine(err))
				continue
			}
			reply("R %d", t.UnixNano())
		default:
			reply("E unknown command %q", cmd)
		}
	}
	return in.Err()
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }

// childProcess is one implementation in a process of its own (the suite's
// binary run with childFlag): its own runtime, client and connections, as
// a waiter on another machine or in another service would be.
type childProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	mu  sync.Mutex
}

// openChild starts a child process of sp.
func openChild(sp spawnSpec) (*childProcess, error) {
	b, err := json.Marshal(sp)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, childFlag, string(b))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &childProcess{cmd: cmd, in: in, out: bufio.NewScanner(out)}, nil
}

func (c *childProcess) worker() (locker, error) { return c, nil }

// close ends the child: its standard input closes, it returns, and its
// client closes its connections.
func (c *childProcess) close() {
	c.in.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// call sends one command and reads its reply's time.
func (c *childProcess) call(line, want string) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		return time.Time{}, fmt.Errorf("child: %w", err)
	}
	if !c.out.Scan() {
		if err := c.out.Err(); err != nil {
			return time.Time{}, fmt.Errorf("child: %w", err)
		}
		return time.Time{}, errors.New("child: exited")
	}
	kind, arg, _ := strings.Cut(c.out.Text(), " ")
	switch kind {
	case want:
		ns, err := strconv.ParseInt(arg, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("child: reply %q", c.out.Text())
		}
		return time.Unix(0, ns), nil
	case "E":
		return time.Time{}, errors.New(arg)
	default:
		return time.Time{}, fmt.Errorf("child: reply %q", c.out.Text())
	}
}

func (c *childProcess) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	_, unlock, err := c.timedLock(ctx, key)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { _, err := unlock(ctx); return err }, nil
}

func (c *childProcess) timedLock(_ context.Context, key string) (time.Time, func(context.Context) (time.Time, error), error) {
	t, err := c.call("L "+key, "G")
	if err != nil {
		return time.Time{}, nil, err
	}
	return t, func(context.Context) (time.Time, error) { return c.call("U", "R") }, nil
}

// timedLocker is a locker that tells when, in its own process, the lock
// returned and the unlock began: a handover's ends without the time the
// suite took to hear of them.
type timedLocker interface {
	timedLock(ctx context.Context, key string) (granted time.Time, unlock func(context.Context) (releasing time.Time, err error), err error)
}

// timedLock locks key with l, stamping the ends in l's process when it
// tells them, else here.
func timedLock(ctx context.Context, l locker, key string) (time.Time, func(context.Context) (time.Time, error), error) {
	if t, ok := l.(timedLocker); ok {
		return t.timedLock(ctx, key)
	}
	unlock, err := l.lock(ctx, key)
	granted := time.Now()
	if err != nil {
		return granted, nil, err
	}
	return granted, func(ctx context.Context) (time.Time, error) {
		t := time.Now()
		return t, unlock(ctx)
	}, nil
}
