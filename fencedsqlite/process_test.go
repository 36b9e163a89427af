package fencedsqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// Child modes: the test binary re-executes itself to act as another
// process sharing the lease file.
const childEnv = "FENCED_SQLITE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "rounds":
		os.Exit(childRounds())
	case "hold":
		os.Exit(childHold())
	case "slowrelease":
		os.Exit(childSlowRelease())
	case "wait":
		os.Exit(childWait())
	}
	fmt.Fprintln(os.Stderr, "unknown child mode")
	os.Exit(2)
}

func openChild() (*fenced.Client, error) {
	d, err := fencedsqlite.OpenFile(context.Background(), os.Getenv("LEASE_FILE"), nil)
	if err != nil {
		return nil, err
	}
	return fenced.NewClient(d, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}), nil
}

// childRounds acquires the key ROUNDS times, journaling entry and exit of
// the critical section with O_APPEND writes (atomic for short lines).
func childRounds() int {
	c, err := openChild()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	journal, err := os.OpenFile(os.Getenv("JOURNAL"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rounds, _ := strconv.Atoi(os.Getenv("ROUNDS"))
	ctx := context.Background()
	for i := 0; i < rounds; i++ {
		err := c.Do(ctx, "proc:shared", &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: time.Minute}, func(ctx context.Context, l *fenced.Lease) error {
			fmt.Fprintf(journal, "enter %d %d\n", os.Getpid(), l.Fence())
			time.Sleep(2 * time.Millisecond)
			_, err := fmt.Fprintf(journal, "exit %d %d\n", os.Getpid(), l.Fence())
			return err
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// childHold acquires the key, prints its fence and waits to be killed.
func childHold() int {
	c, err := openChild()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := c.TryAcquire(context.Background(), "proc:killed", &fenced.LeaseOptions{TTL: time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(l.Fence())
	select {}
}

func child(t *testing.T, mode, file string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "LEASE_FILE="+file)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestProcessesShareOneFile runs several OS processes competing for one key
// in one SQLite file and checks from their journal that no two were ever
// inside the critical section at once and that fences strictly increased.
func TestProcessesShareOneFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "leases.db")
	journal := filepath.Join(dir, "journal")
	if err := os.WriteFile(journal, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const procs, rounds = 4, 15
	var cmds []*exec.Cmd
	for i := 0; i < procs; i++ {
		cmd := child(t, "rounds", file, "JOURNAL="+journal, "ROUNDS="+strconv.Itoa(rounds))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	data, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2*procs*rounds {
		t.Fatalf("journal has %d lines, want %d", len(lines), 2*procs*rounds)
	}
	var lastFence uint64
	pids := map[string]bool{}
	for i := 0; i < len(lines); i += 2 {
		var pid1, pid2 string
		var f1, f2 uint64
		var w1, w2 string
		fmt.Sscan(lines[i], &w1, &pid1, &f1)
		fmt.Sscan(lines[i+1], &w2, &pid2, &f2)
		if w1 != "enter" || w2 != "exit" || pid1 != pid2 || f1 != f2 {
			t.Fatalf("journal lines %d-%d interleave two holders:\n%s\n%s", i, i+1, lines[i], lines[i+1])
		}
		if f1 <= lastFence {
			t.Fatalf("fence %d after %d: not strictly increasing", f1, lastFence)
		}
		lastFence = f1
		pids[pid1] = true
	}
	if len(pids) != procs {
		t.Fatalf("%d processes got the lease, want %d", len(pids), procs)
	}
}

// TestKilledHolderIsReplacedAfterTTL kills a holding process with SIGKILL:
// the key stays held until its TTL runs out at the authority, then the next
// grant gets a higher fence.
func TestKilledHolderIsReplacedAfterTTL(t *testing.T) {
	file := filepath.Join(t.TempDir(), "leases.db")
	cmd := child(t, "hold", file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	killedFence, _ := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killedAt := time.Now()

	d, err := fencedsqlite.OpenFile(context.Background(), file, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(d, nil)
	defer c.Close()
	ctx := context.Background()
	if _, err := c.TryAcquire(ctx, "proc:killed", nil); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("right after the kill: %v, want ErrHeld (the grant outlives its holder until the TTL)", err)
	}
	l, err := c.Acquire(ctx, "proc:killed", &fenced.LeaseOptions{MaxWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Fence() <= killedFence {
		t.Fatalf("new fence %d, want > killed holder's %d", l.Fence(), killedFence)
	}
	if waited := time.Since(killedAt); waited < 500*time.Millisecond {
		t.Fatalf("replaced %v after the kill, before the 1s TTL could have run out", waited)
	}
}

// TestProcessesCreateTheFileTogether starts several processes that open a
// lease file nobody has created yet, all at once: creating the file,
// switching it to WAL and creating the tables must not fail in any of them.
func TestProcessesCreateTheFileTogether(t *testing.T) {
	for round := 0; round < 4; round++ {
		dir := t.TempDir()
		file := filepath.Join(dir, "fresh.db")
		journal := filepath.Join(dir, "journal")
		if err := os.WriteFile(journal, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var cmds []*exec.Cmd
		for i := 0; i < 6; i++ {
			cmd := child(t, "rounds", file, "JOURNAL="+journal, "ROUNDS=1")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, cmd)
		}
		// All are waited for before a failure ends the test and removes
		// the files the others still use.
		failed := 0
		for _, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				t.Errorf("round %d: a process opening the new file failed: %v", round, err)
				failed++
			}
		}
		if failed > 0 {
			t.FailNow()
		}
	}
}
