package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe"
)

// Items of the count tests: item h is routed to partition h mod P, so at
// P=4 and P=8 each item has a different partition key in the two counts
// (for h mod 8 ≥ 4) or the same (h mod 8 < 4).
const countItems = 16

// countTTL is the TTL of the count tests' members on a quiet machine
// (countMachineTTL gives a loaded one's). Their leases accept a
// repeatable fence (single-node Redis): the fence plays no part here.
const countTTL = time.Second

// countMachineTTL is the members' TTL on this machine, as loaded now:
// a member that stays live must not lapse while the test runs (B's
// renewals lapsed under load, and A, resumed, then kept the group).
func countMachineTTL(t *testing.T, store string) time.Duration {
	t.Helper()
	// Measured once: a sampler writing all along would contend with the
	// members for SQLite's write lock.
	ttl, worst := machineTTL(t, []*fenced.Client{partOpen(t, store), partOpen(t, store)}, countTTL)
	t.Logf("TTL %v (%v on a quiet machine; the worst delay of 2 clients probing at once was %v)", ttl, countTTL,
		worst.Round(time.Millisecond))
	return ttl
}

// itemLog records, for each item, when a member worked it: a sample is
// taken only while the partition's lease is valid (its time is read
// before Lease.Err, which reads the clock), so a sample proves a valid
// lease at that instant.
type itemLog struct {
	mu  sync.Mutex
	out func(line string)
}

// work returns a work function that samples its partition's items every
// 10 ms at partition count p.
func (lg *itemLog) work(p int) func(context.Context, recipe.Partition) error {
	return func(ctx context.Context, part recipe.Partition) error {
		for {
			at := time.Now()
			if part.Lease.Err() == nil {
				lg.mu.Lock()
				for h := part.Index; h < countItems; h += p {
					lg.out(fmt.Sprintf("W %d %s %d %d", h, part.Lease.Key(), part.Lease.Fence(), at.UnixNano()))
				}
				lg.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// TestPartitionsCountMember is a member process of the count tests; it
// does nothing unless started by startCountMember. It joins, samples its
// items into its log, and leaves on SIGTERM; if the member stops by
// itself it logs "E <error>" and exits with status 3.
func TestPartitionsCountMember(t *testing.T) {
	if os.Getenv("PARTITIONS_COUNT_STORE") == "" {
		return
	}
	f, err := os.OpenFile(os.Getenv("PARTITIONS_COUNT_LOG"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lg := &itemLog{out: func(line string) { fmt.Fprintln(f, line) }}
	ctx := context.Background()
	c, err := fenced.Open(ctx, os.Getenv("PARTITIONS_COUNT_STORE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	p, _ := strconv.Atoi(os.Getenv("PARTITIONS_COUNT_P"))
	ttl, err := time.ParseDuration(os.Getenv("PARTITIONS_COUNT_TTL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	m, err := recipe.JoinPartitions(ctx, c, os.Getenv("PARTITIONS_COUNT_GROUP"), p, lg.work(p),
		&recipe.PartitionsOptions{MemberID: os.Getenv("PARTITIONS_COUNT_ID"), Lease: &fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceRepeatable}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lg.mu.Lock()
	lg.out("J")
	lg.mu.Unlock()
	select {
	case <-sigs:
		m.Leave(ctx)
		os.Exit(0)
	case <-m.Done():
		err := m.Leave(ctx)
		lg.mu.Lock()
		lg.out("E " + strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
		lg.mu.Unlock()
		c.Close()
		os.Exit(3)
	}
}

// countMember is a member process of the count tests.
type countMember struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

func startCountMember(t *testing.T, store, group, id string, p int, ttl time.Duration) *countMember {
	t.Helper()
	dir := t.TempDir()
	m := &countMember{log: filepath.Join(dir, "log"), exited: make(chan struct{})}
	m.cmd = exec.Command(os.Args[0], "-test.run=^TestPartitionsCountMember$")
	m.cmd.Env = append(os.Environ(), "PARTITIONS_COUNT_STORE="+store, "PARTITIONS_COUNT_GROUP="+group,
		"PARTITIONS_COUNT_ID="+id, "PARTITIONS_COUNT_P="+strconv.Itoa(p), "PARTITIONS_COUNT_LOG="+m.log, "PARTITIONS_COUNT_TTL="+ttl.String())
	m.cmd.Stderr = os.Stderr
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.cmd.Wait(); close(m.exited) }()
	t.Cleanup(func() {
		m.cmd.Process.Signal(syscall.SIGCONT)
		m.cmd.Process.Kill()
		<-m.exited
	})
	return m
}

// stop stops the member (SIGSTOP) at a moment it holds no write lock of
// the store: on SQLite a process stopped inside a write transaction
// holds the database's lock, which stalls every other process (a hazard
// of a shared SQLite file, not of Partitions). A write by c right after
// the stop tells; if it cannot write, the member is continued and
// stopped again.
func (m *countMember) stop(t *testing.T, c *fenced.Client) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		m.cmd.Process.Signal(syscall.SIGSTOP)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l, err := c.TryAcquire(ctx, "probe", &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
		cancel()
		if err == nil {
			l.Release(context.Background())
			return
		}
		m.cmd.Process.Signal(syscall.SIGCONT)
		if attempt == 20 {
			t.Fatalf("the stopped member held the store's write lock 20 times in a row: %v", err)
		}
		time.Sleep(time.Duration(attempt) * 7 * time.Millisecond)
	}
}

// lines returns the member's log.
func (m *countMember) lines() []string {
	b, _ := os.ReadFile(m.log)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// waitOwnsAll waits until the member has sampled every item since since.
func (m *countMember) waitOwnsAll(t *testing.T, since time.Time, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		seen := map[string]bool{}
		for _, l := range m.lines() {
			if w := strings.Fields(l); len(w) == 5 && w[0] == "W" {
				if at, _ := strconv.ParseInt(w[4], 10, 64); at > since.UnixNano() {
					seen[w[1]] = true
				}
			}
		}
		if len(seen) == countItems {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member worked %d of %d items within %v", len(seen), countItems, within)
		}
	}
}

// span is one member's work on one item under one grant: from its first
// to its last sample.
type span struct {
	who        string
	key        string
	fence      uint64
	first, end int64
}

// overlaps returns, for each item worked by two members under grants
// whose sampled spans overlap in time, a description of the first such
// pair. It is the safety check: an item must never be worked by two
// members at once, whatever their partition counts.
func overlaps(logs map[string][]string) []string {
	spans := map[int]map[string]*span{} // item -> who/key/fence -> span
	for who, lines := range logs {
		for _, l := range lines {
			w := strings.Fields(l)
			if len(w) != 5 || w[0] != "W" {
				continue
			}
			h, _ := strconv.Atoi(w[1])
			f, _ := strconv.ParseUint(w[3], 10, 64)
			at, _ := strconv.ParseInt(w[4], 10, 64)
			id := who + " " + w[2] + " " + w[3]
			if spans[h] == nil {
				spans[h] = map[string]*span{}
			}
			s := spans[h][id]
			if s == nil {
				s = &span{who: who, key: w[2], fence: f, first: at, end: at}
				spans[h][id] = s
			}
			s.first, s.end = min(s.first, at), max(s.end, at)
		}
	}
	var out []string
	for h := range countItems {
		var ss []*span
		for _, s := range spans[h] {
			ss = append(ss, s)
		}
		slices.SortFunc(ss, func(a, b *span) int { return int(a.first - b.first) })
	found:
		for i, a := range ss {
			for _, b := range ss[i+1:] {
				if a.who != b.who && b.first <= a.end {
					out = append(out, fmt.Sprintf("item %d: %s under %s fence %d and %s under %s fence %d, both for %v",
						h, a.who, a.key, a.fence, b.who, b.key, b.fence, time.Duration(min(a.end, b.end)-b.first)))
					break found
				}
			}
		}
	}
	return out
}

// countStores are the stores of the count tests: SQLite and Redis.
func countStores(t *testing.T) map[string]string {
	return map[string]string{
		"sqlite": "sqlite://" + filepath.Join(t.TempDir(), "leases.db"),
		"redis":  testenv.StartRedis(t, testenv.RedisConfig{}).URL(),
	}
}

// TestPartitionsCountLapsedMemberStops: a member of a P=4 group is
// stopped (SIGSTOP) past its TTL; a member with P=8 joins meanwhile (once
// every lease of the stopped one has ended); then the stopped member
// resumes. It must not work anything again: when it takes its lapsed
// membership back it finds the group at P=8 and stops with
// ErrPartitionCount, releasing the membership it took back, so the group
// never lists both counts for longer than that check. No item is worked
// by both at once. Before, the resumed member took its membership back
// without the count check and stayed a live member at P=4 next to P=8.
func TestPartitionsCountLapsedMemberStops(t *testing.T) {
	for name, store := range countStores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			ttl := countMachineTTL(t, store)
			a := startCountMember(t, store, "lapse", "a", 4, ttl)
			a.waitOwnsAll(t, time.Time{}, 20*time.Second)
			c := partOpen(t, store)
			a.stop(t, c)
			stopped := time.Now()
			// B joins once A's membership has lapsed at the store; the join
			// waits (if need be) for A's partition leases to end as well.
			for {
				st, err := recipe.ReadGroup(ctx, c, "lapse")
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Members) == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			var bmu sync.Mutex
			var blog []string
			lb := &itemLog{out: func(l string) { bmu.Lock(); blog = append(blog, l); bmu.Unlock() }}
			b, err := recipe.JoinPartitions(ctx, c, "lapse", 8, lb.work(8), &recipe.PartitionsOptions{MemberID: "b", Lease: &fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceRepeatable}})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Leave(ctx)
			partBalanced(t, []*recipe.Partitions{b}, 8, 20*time.Second)
			t.Logf("B joined at P=8 and owns all %v after A's stop", time.Since(stopped).Round(time.Millisecond))
			a.cmd.Process.Signal(syscall.SIGCONT)
			resumed := time.Now()
			// A resumes with every lease of its expired: it sees so at once
			// (Lease.Err reads the clock), takes its membership back at its
			// next step (woken at once, or at its poll: TTL/3), lists and
			// stops. Bound: that poll and a TTL for the steps' store round
			// trips on a loaded machine.
			bound := ttl/3 + ttl
			select {
			case <-a.exited:
			case <-time.After(bound + 10*time.Second):
				st, _ := recipe.ReadGroup(ctx, c, "lapse")
				t.Fatalf("A still runs %v after it resumed (members now %+v; TTL %v; B stopped by itself: %v); it must stop once it finds the group at another count",
					time.Since(resumed).Round(time.Millisecond), st.Members, ttl, b.Err())
			}
			took := time.Since(resumed)
			lines := a.lines()
			last := lines[len(lines)-1]
			if a.cmd.ProcessState.ExitCode() != 3 || !strings.Contains(last, "partition count disagrees") || !strings.Contains(last, `"b" with 8`) {
				t.Fatalf("A exited with %d, last logged %q; want 3 and an ErrPartitionCount naming b", a.cmd.ProcessState.ExitCode(), last)
			}
			t.Logf("A stopped %v after it resumed (its poll and a TTL: %v, + 10s before the test gives up): %s", took.Round(time.Millisecond), bound.Round(time.Millisecond), strings.TrimPrefix(last, "E "))
			st, err := recipe.ReadGroup(ctx, c, "lapse")
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Members) != 1 || st.Members[0].ID != "b" {
				t.Errorf("members after A stopped: %+v, want only b", st.Members)
			}
			time.Sleep(100 * time.Millisecond)
			bmu.Lock()
			logs := map[string][]string{"a": lines, "b": slices.Clone(blog)}
			bmu.Unlock()
			if o := overlaps(logs); len(o) > 0 {
				t.Errorf("%d of %d items worked by two members at once:\n%s", len(o), countItems, strings.Join(o, "\n"))
			}
		})
	}
}

// TestPartitionsCountJoinWaitsForLeases: a member of a P=4 group is
// stopped and its membership broken (an operator who took it for dead),
// so the group lists no live member while the stopped member's partition
// leases still stand; a member with P=8 tries to join, and the stopped
// member resumes within its leases' validity. Before, the join looked
// only at live members: B took the partitions A did not hold while A,
// resumed, took its membership back without the count check and went on
// with its own, and 8 of the 16 items were worked by both, each under a
// valid lease of a different key. Now the join waits for A's leases, A
// takes its membership back (no other count is live) and keeps the
// group, and B's join ends in ErrPartitionCount (or, if A's leases ran
// out before it resumed on a slow machine, B joins and A stops). Either
// way no item is worked by both at once: that check never bends.
func TestPartitionsCountJoinWaitsForLeases(t *testing.T) {
	for name, store := range countStores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			ttl := countMachineTTL(t, store)
			a := startCountMember(t, store, "held", "a", 4, ttl)
			a.waitOwnsAll(t, time.Time{}, 20*time.Second)
			c := partOpen(t, store)
			a.stop(t, c)
			// SQLite may answer a break with SQLITE_BUSY while this
			// process's own release of the probe commits (the member is
			// stopped outside any write): retried, as an operator would.
			for attempt := 1; ; attempt++ {
				_, err := c.Break(ctx, "held/m/4/a", "taken for dead", "test")
				if err == nil {
					break
				}
				if errors.Is(err, fenced.ErrNotHeld) {
					// Lapsed already: A's stop took more than its TTL
					// from its last renewal (a loaded machine).
					t.Logf("A's membership had lapsed before the break")
					break
				}
				if attempt == 10 {
					t.Fatal(err)
				}
				t.Logf("break, attempt %d: %v", attempt, err)
				time.Sleep(20 * time.Millisecond)
			}
			var bmu sync.Mutex
			var blog []string
			lb := &itemLog{out: func(l string) { bmu.Lock(); blog = append(blog, l); bmu.Unlock() }}
			type joined struct {
				m   *recipe.Partitions
				err error
			}
			done := make(chan joined, 1)
			go func() {
				m, err := recipe.JoinPartitions(ctx, c, "held", 8, lb.work(8), &recipe.PartitionsOptions{MemberID: "b", Lease: &fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceRepeatable}})
				done <- joined{m, err}
			}()
			// Resume A while its partition leases are still valid: it was
			// stopped a fraction of its TTL.
			time.Sleep(ttl / 4)
			a.cmd.Process.Signal(syscall.SIGCONT)
			resumed := time.Now()
			var j joined
			select {
			case j = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("B's join neither ended nor gave up within 30s")
			}
			switch {
			case j.err == nil:
				// On a slow machine A's leases may have run out before it
				// resumed: then B may join, and A, resumed, must find the
				// group at P=8 and stop, as in
				// TestPartitionsCountLapsedMemberStops.
				defer j.m.Leave(ctx)
				select {
				case <-a.exited:
					t.Logf("B joined (A's leases had run out before A resumed); A stopped: %q", a.lines()[len(a.lines())-1])
				case <-time.After(ttl/3 + ttl + 10*time.Second):
					t.Errorf("B joined, and A is still live at P=4 %v after it resumed", time.Since(resumed).Round(time.Millisecond))
				}
				time.Sleep(2 * ttl) // let both run: an overlap, if any, shows in the samples
			case errors.Is(j.err, recipe.ErrPartitionCount):
				t.Logf("B's join gave up %v after A resumed: %v", time.Since(resumed).Round(time.Millisecond), j.err)
				// A works on: it sampled every item after it resumed.
				a.waitOwnsAll(t, resumed, 10*time.Second)
				select {
				case <-a.exited:
					t.Errorf("A exited: %q", a.lines()[len(a.lines())-1])
				default:
				}
			default:
				t.Errorf("B's join: %v, want ErrPartitionCount while A (P=4) is live again", j.err)
			}
			bmu.Lock()
			logs := map[string][]string{"a": a.lines(), "b": slices.Clone(blog)}
			bmu.Unlock()
			if o := overlaps(logs); len(o) > 0 {
				t.Errorf("%d of %d items worked by two members at once:\n%s", len(o), countItems, strings.Join(o, "\n"))
			}
		})
	}
}
