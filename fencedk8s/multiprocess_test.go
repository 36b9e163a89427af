package fencedk8s_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/fenced-dev/fenced/fencedk8s"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	childproc.Main(m, map[string]func() int{"candidate": childCandidate, "term": childTerm})
}

// childCandidate runs client-go's elector on the parent's store until
// killed. While it leads it appends "lead PID EPOCH" once, then "beat PID
// EPOCH" every 50ms, to the parent's output.
func childCandidate() int {
	ctx := context.Background()
	client, err := childproc.Store(ctx)
	if err != nil {
		return childproc.Fail(err)
	}
	defer client.Close()
	pid := os.Getpid()
	lock, err := fencedk8s.New(client, "controller", "candidate-"+strconv.Itoa(pid), &fencedk8s.Options{
		RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond,
	})
	if err != nil {
		return childproc.Fail(err)
	}
	out, err := childproc.Output()
	if err != nil {
		return childproc.Fail(err)
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: 2 * time.Second,
		RenewDeadline: 1500 * time.Millisecond,
		RetryPeriod:   200 * time.Millisecond,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				ctx, l := lock.LeaderContext(ctx)
				if l == nil {
					return // lost already
				}
				epoch := l.Fence()
				fmt.Fprintf(out, "lead %d %d\n", pid, epoch)
				t := time.NewTicker(50 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						fmt.Fprintf(out, "beat %d %d\n", pid, epoch)
					}
				}
			},
			OnStoppedLeading: func() { fmt.Fprintf(out, "stopped %d\n", pid) },
		},
	})
	return 0
}

type event struct {
	kind       string
	pid, epoch int
}

func readEvents(t *testing.T, path string) []event {
	t.Helper()
	var evs []event
	for _, f := range childproc.Lines(t, path) {
		if len(f) < 2 {
			continue
		}
		ev := event{kind: f[0]}
		ev.pid, _ = strconv.Atoi(f[1])
		if len(f) > 2 {
			ev.epoch, _ = strconv.Atoi(f[2])
		}
		evs = append(evs, ev)
	}
	return evs
}

func leaders(evs []event) []event {
	var out []event
	for _, e := range evs {
		if e.kind == "lead" {
			out = append(out, e)
		}
	}
	return out
}

// TestClientGoElectorOnFenced: three processes run client-go's
// LeaderElector on one SQLite store through ResourceLock. One leads; after
// a kill -9 of it, exactly one other takes over, with a higher epoch, and
// no process beats as leader while another does.
func TestClientGoElectorOnFenced(t *testing.T) {
	dir := t.TempDir()
	store := "sqlite://" + filepath.Join(dir, "leases.db")
	out := filepath.Join(dir, "events")
	procs := map[int]*testenv.Process{}
	for _, p := range childproc.Start(t, "candidate", 3, store, out) {
		procs[p.Cmd.Process.Pid] = p
	}
	waitLeaders := func(n int) []event {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if ls := leaders(readEvents(t, out)); len(ls) >= n {
				return ls
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("fewer than %d leaders in 15s: %v", n, readEvents(t, out))
		return nil
	}
	first := waitLeaders(1)[0]
	time.Sleep(500 * time.Millisecond) // the others are campaigning
	if ls := leaders(readEvents(t, out)); len(ls) != 1 {
		t.Fatalf("two leaders at once: %v", ls)
	}
	killed := procs[first.pid]
	if killed == nil {
		t.Fatalf("leader pid %d is none of the candidates", first.pid)
	}
	if err := killed.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-killed.Exited()
	second := waitLeaders(2)[1]
	time.Sleep(time.Second)
	evs := readEvents(t, out)
	if ls := leaders(evs); len(ls) != 2 {
		t.Fatalf("leaders after the kill: %v, want one new", ls)
	}
	if second.pid == first.pid || second.epoch <= first.epoch {
		t.Fatalf("new leader %+v after %+v: want another process with a higher epoch", second, first)
	}
	// Beats alternate by term: once the new leader beats, the old never
	// does again.
	newSeen := false
	for _, e := range evs {
		if e.kind != "beat" {
			continue
		}
		switch e.pid {
		case second.pid:
			newSeen = true
		case first.pid:
			if newSeen {
				t.Fatalf("the killed leader beat after the new one: %v", evs)
			}
		default:
			t.Fatalf("pid %d beat without leading", e.pid)
		}
	}
	t.Logf("leader pid %d epoch %d killed; pid %d took over with epoch %d", first.pid, first.epoch, second.pid, second.epoch)
	if !newSeen {
		t.Fatalf("the new leader never beat: %v", evs)
	}
}
