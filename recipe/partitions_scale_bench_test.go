package recipe_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// W5, partitions at scale: N member processes (this test binary,
// re-executed into TestPartitionsScaleMember) join one group of P
// partitions on a real store, with the default rebalancing knobs
// (RebalanceThreshold 0.1, Dampening 0.8, MaxInTransition ⌈P/4⌉). Per
// cell (backend, P, N), in this order:
//
//   - form: the N members start at once; the time to a stable, balanced
//     group (below);
//   - rest: W5_REST (10 s) with nothing changing: the server's requests
//     per member per renewal period (TTL/3), and each member process's
//     CPU (utime + stime from /proc/<pid>/stat) and resident memory
//     (VmRSS from /proc/<pid>/status);
//   - join: one more member process starts (N → N+1);
//   - leave: that member gets SIGTERM and leaves (Leave: its work ends,
//     its leases are released, the doorbell rung; N+1 → N);
//   - kill: one of the first N is killed with SIGKILL (N → N-1): its
//     leases stand until their TTL ends.
//
// After each change: the time from the change (the process start, the
// signal) to a stable, balanced assignment: every partition owned (the
// live members' Owned counts sum to P, so none is in hand-off), each
// member within the default threshold of its share, |owned − P/M| ≤
// 0.1·⌈P/M⌉ + 1 (the +1 for the rounding of shares), no member's count
// changing for W5_QUIET (2 s: the throttle's later waves come within a
// poll), and one recipe.ReadGroup agreeing (the live members are the
// expected ones, every partition held by one of them). The time is to
// the last change of a count before that quiet window. Members report
// their counts on their stdout at each change (an OnEvent wake-up, and
// a 100 ms tick for hand-offs, which raise no event). A change that is
// not stable within W5_DEADLINE (60 s; 180 s to form) is reported as
// such, with the counts it ended at, and the cell stops there.
//
// Moves: the grants the change caused (the members' Stats.Acquired,
// summed), the hand-offs (Stats.HandOffs), and the partitions whose
// owner differs between two ReadGroup listings, before the change and
// once stable, against the minimum the change requires: a join, the
// newcomer's balanced share ⌊P/(N+1)⌋, or ⌈0.9·⌊P/(N+1)⌋⌉ to within the
// threshold, where the throttle stops; a leave or a kill, what the
// leaver held. The throttle's plan for a join (w5JoinPlan) is what
// Dampening and the threshold move: waves of ⌈0.8·excess⌉ per member, at
// most MaxInTransition a wave, until every member is within 10 % of its
// target.
//
//	W5_OUT=/tmp/w5.md W5_CELLS=1024x16 go test -run '^$' -bench 'BenchmarkPartitionsScale/redis$' -benchtime 1x -timeout 2h ./recipe/
//
// W5_CELLS picks cells (PxN, comma-separated; all if unset), -bench the
// backends. scripts/bench.sh --w5 runs it (--quick: 1024 × 16 on every
// backend).
// It does not run in `go test ./...` (a benchmark), and its member test
// returns at once without W5_MEMBER_STORE.
func BenchmarkPartitionsScale(b *testing.B) {
	ttl := w5Duration(b, "W5_TTL", 3*time.Second)
	cells := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("W5_CELLS"), ",") {
		var p, n int
		if _, err := fmt.Sscanf(s, "%dx%d", &p, &n); s != "" && (err != nil || !slices.Contains(w5Ps, p) || !slices.Contains(w5Ns, n)) {
			b.Fatalf("W5_CELLS: %q is not PxN with P in %v and N in %v", s, w5Ps, w5Ns)
		}
		if s != "" {
			cells[s] = true
		}
	}
	for _, st := range countedStores() {
		b.Run(st.name, func(b *testing.B) {
			url, count := st.start(b)
			for _, p := range w5Ps {
				for _, n := range w5Ns {
					if len(cells) > 0 && !cells[fmt.Sprintf("%dx%d", p, n)] {
						continue
					}
					b.Run(fmt.Sprintf("P=%d/N=%d", p, n), func(b *testing.B) {
						c := &w5Cell{b: b, backend: st.name, url: url, count: count, fence: st.fence, p: p, n: n, ttl: ttl,
							group: fmt.Sprintf("w5-%d-%d", p, n)}
						c.run()
					})
				}
			}
		})
	}
}

// The grid of W5: partition counts and member counts.
var (
	w5Ps = []int{256, 1024, 4096}
	w5Ns = []int{4, 16, 32}
)

// TestPartitionsScaleMember is a member process of BenchmarkPartitionsScale;
// it returns at once unless started by it (W5_MEMBER_STORE set).
func TestPartitionsScaleMember(t *testing.T) {
	if os.Getenv("W5_MEMBER_STORE") == "" {
		return
	}
	if err := w5Member(); err != nil {
		fmt.Printf("E %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// w5Member joins the group with idle work and prints, on its stdout, "J
// <unix ns>" once joined, "S <unix ns> <owned> <acquired> <handoffs>" at
// every change of those, and "L <unix ns>" once it left after SIGTERM.
func w5Member() error {
	ctx := context.Background()
	p, _ := strconv.Atoi(os.Getenv("W5_MEMBER_P"))
	minFence, _ := strconv.Atoi(os.Getenv("W5_MEMBER_FENCE"))
	ttl, err := time.ParseDuration(os.Getenv("W5_MEMBER_TTL"))
	if err != nil {
		return err
	}
	c, err := fenced.Open(ctx, os.Getenv("W5_MEMBER_STORE"), nil)
	if err != nil {
		return err
	}
	defer c.Close()
	out := bufio.NewWriter(os.Stdout)
	wake := make(chan struct{}, 1)
	idle := func(ctx context.Context, _ recipe.Partition) error { <-ctx.Done(); return nil }
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	m, err := recipe.JoinPartitions(ctx, c, os.Getenv("W5_MEMBER_GROUP"), p, idle, &recipe.PartitionsOptions{
		MemberID: os.Getenv("W5_MEMBER_ID"),
		Lease:    &fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceStrength(minFence)},
		OnEvent: func(recipe.PartitionEvent) {
			select {
			case wake <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "J %d\n", time.Now().UnixNano())
	out.Flush()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last recipe.PartitionStats
	var lastOwned int
	for first := true; ; first = false {
		select {
		case <-sigs:
			err := m.Leave(ctx)
			fmt.Fprintf(out, "L %d\n", time.Now().UnixNano())
			out.Flush()
			return err
		case <-m.Done():
			return fmt.Errorf("member stopped: %v", m.Err())
		case <-wake:
		case <-tick.C:
		}
		s, owned := m.Stats(), len(m.Owned())
		if first || owned != lastOwned || s.Acquired != last.Acquired || s.HandOffs != last.HandOffs {
			fmt.Fprintf(out, "S %d %d %d %d\n", time.Now().UnixNano(), owned, s.Acquired, s.HandOffs)
			out.Flush()
			last, lastOwned = s, owned
		}
	}
}

// w5Duration reads a duration from the environment, def if unset.
func w5Duration(b *testing.B, name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration", name, s)
	}
	return d
}

// w5Proc is one member process as the benchmark sees it.
type w5Proc struct {
	id     string
	cmd    *exec.Cmd
	exited chan struct{}
	// Under w5Cell.mu: the member's last report.
	joined             time.Time // when JoinPartitions returned; zero before
	owned              int
	acquired, handoffs uint64
	at                 time.Time // of the last change of owned
	last               string    // its last line
}

// w5Cell is one (backend, P, N) run.
type w5Cell struct {
	b       *testing.B
	backend string
	url     string
	count   func(b *testing.B) serverCounts
	fence   fenced.FenceStrength
	p, n    int
	ttl     time.Duration
	group   string
	client  *fenced.Client

	mu    sync.Mutex
	procs map[string]*w5Proc
	cells map[string]string // the report's row, by w5Header's names
}

// w5Header names the columns of the report (W5_OUT); w5Cell.cells
// holds a row by these names.
var w5Header = []string{"backend", "P", "N", "load 1-min", "form", "join", "join moves (min / in threshold; plan)",
	"leave", "leave moves (min)", "kill -9", "kill moves (min)", "req/member/period at rest", "CPU/member at rest",
	"RSS/member"}

func (c *w5Cell) run() {
	b := c.b
	c.procs = map[string]*w5Proc{}
	load0 := w5Load()
	c.cells = map[string]string{"backend": c.backend, "P": strconv.Itoa(c.p), "N": strconv.Itoa(c.n)}
	defer func() {
		for _, pr := range c.procs {
			pr.cmd.Process.Kill()
			<-pr.exited
		}
		c.cells["load 1-min"] = load0 + " → " + w5Load()
		c.report()
	}()
	var err error
	if c.client, err = fenced.Open(context.Background(), c.url, nil); err != nil {
		b.Fatal(err)
	}
	defer c.client.Close()
	deadline := w5Duration(b, "W5_DEADLINE", 60*time.Second)

	// Form.
	start := time.Now()
	var ids []string
	for i := range c.n {
		ids = append(ids, fmt.Sprintf("m%02d", i))
		c.start(ids[i])
	}
	if !c.phase("form", ids, start, max(3*deadline, 180*time.Second)) {
		return
	}
	c.rest(ids)

	// Join: one more process.
	before, acq := c.snapshot(), c.acquired()
	newcomer := fmt.Sprintf("m%02d", c.n)
	start = time.Now()
	c.start(newcomer)
	if !c.phase("join", append(slices.Clone(ids), newcomer), start, deadline) {
		return
	}
	c.mu.Lock()
	c.cells["join"] += fmt.Sprintf(" (joined at %.2f s)", c.procs[newcomer].joined.Sub(start).Seconds())
	c.mu.Unlock()
	share := c.p / (c.n + 1)
	c.cells["join moves (min / in threshold; plan)"] = fmt.Sprintf("%s / %d; %d)", c.moves(before, acq, share),
		int(math.Ceil(0.9*float64(share)-1e-9)), w5JoinPlan(before, ids, c.p))

	// Leave: the newcomer, SIGTERM.
	before, acq = c.snapshot(), c.acquired()
	held := c.heldBy(before, newcomer)
	start = time.Now()
	c.procs[newcomer].cmd.Process.Signal(syscall.SIGTERM)
	ok := c.phase("leave", ids, start, deadline)
	c.cells["leave moves (min)"] = c.moves(before, acq, held) + ")"
	if !ok {
		return
	}
	select {
	case <-c.procs[newcomer].exited:
	case <-time.After(deadline):
		c.cells["leave"] += fmt.Sprintf(" (the leaver had not exited %v after SIGTERM)", deadline)
	}

	// Kill -9: the first member.
	before, acq = c.snapshot(), c.acquired()
	dead := ids[0]
	held = c.heldBy(before, dead)
	start = time.Now()
	c.procs[dead].cmd.Process.Kill()
	<-c.procs[dead].exited
	c.phase("kill -9", ids[1:], start, deadline)
	c.cells["kill moves (min)"] = c.moves(before, acq, held) + ")"
}

// start starts member id's process and a reader of its reports.
func (c *w5Cell) start(id string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestPartitionsScaleMember$")
	cmd.Env = append(os.Environ(), "W5_MEMBER_STORE="+c.url, "W5_MEMBER_ID="+id, "W5_MEMBER_GROUP="+c.group,
		"W5_MEMBER_P="+strconv.Itoa(c.p), "W5_MEMBER_TTL="+c.ttl.String(), "W5_MEMBER_FENCE="+strconv.Itoa(int(c.fence)))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.b.Fatal(err)
	}
	pr := &w5Proc{id: id, cmd: cmd, exited: make(chan struct{})}
	c.mu.Lock()
	c.procs[id] = pr
	c.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			c.mu.Lock()
			pr.last = sc.Text()
			switch {
			case len(f) == 2 && f[0] == "J":
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				pr.joined = time.Unix(0, ns)
			case len(f) == 5 && f[0] == "S":
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				owned, _ := strconv.Atoi(f[2])
				pr.acquired, _ = strconv.ParseUint(f[3], 10, 64)
				pr.handoffs, _ = strconv.ParseUint(f[4], 10, 64)
				if owned != pr.owned {
					pr.owned, pr.at = owned, time.Unix(0, ns)
				}
			}
			c.mu.Unlock()
		}
		cmd.Wait()
		close(pr.exited)
	}()
}

// waitStable waits until the members live (and no others) hold a
// stable, balanced assignment, and returns the time from start to its
// last change; ok false if it was not stable within deadline, with why:
// where it stood.
func (c *w5Cell) waitStable(live []string, start time.Time, deadline time.Duration) (time.Duration, string, bool) {
	quiet := w5Duration(c.b, "W5_QUIET", 2*time.Second)
	share := float64(c.p) / float64(len(live))
	slack := 0.1*math.Ceil(share) + 1
	end := start.Add(deadline)
	var why string
	for time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
		c.mu.Lock()
		total, last, balanced := 0, start, true
		lo, hi := c.p, 0
		for _, id := range live {
			pr := c.procs[id]
			total += pr.owned
			lo, hi = min(lo, pr.owned), max(hi, pr.owned)
			if pr.joined.IsZero() || math.Abs(float64(pr.owned)-share) > slack {
				balanced = false
			}
			if pr.at.After(last) {
				last = pr.at
			}
		}
		c.mu.Unlock()
		why = fmt.Sprintf("owned %d/%d, counts %d..%d, share %.1f ± %.1f", total, c.p, lo, hi, share, slack)
		c.mu.Lock()
		for _, id := range live {
			if pr := c.procs[id]; pr.owned == lo {
				why += fmt.Sprintf("; %s joined %v, last said %q", id, !pr.joined.IsZero(), pr.last)
				break
			}
		}
		c.mu.Unlock()
		if !balanced || total != c.p || time.Since(last) < quiet {
			continue
		}
		st, err := recipe.ReadGroup(context.Background(), c.client, c.group)
		if err != nil {
			why = "ReadGroup: " + err.Error()
			continue
		}
		var ids []string
		for _, m := range st.Members {
			ids = append(ids, m.ID)
		}
		if !slices.Equal(ids, live) || len(st.Owners) != c.p {
			why = fmt.Sprintf("the store lists members %v and %d of %d partitions owned by them", ids, len(st.Owners), c.p)
			continue
		}
		c.mu.Lock()
		same := true
		for _, id := range live {
			same = same && !c.procs[id].at.After(last)
		}
		c.mu.Unlock()
		if same {
			return last.Sub(start), "", true
		}
	}
	return deadline, why, false
}

// phase waits for the change of what (a column of the report) begun at
// start to come to a stable assignment among live, and records the time
// it took or that it did not.
func (c *w5Cell) phase(what string, live []string, start time.Time, deadline time.Duration) bool {
	d, why, ok := c.waitStable(live, start, deadline)
	if !ok {
		c.b.Logf("%s/P=%d/N=%d %s: NOT STABLE within %v: %s", c.backend, c.p, c.n, what, deadline, why)
		c.cells[what] = fmt.Sprintf("**not stable in %v** (%s)", deadline, why)
		return false
	}
	c.b.ReportMetric(float64(d.Milliseconds()), strings.ReplaceAll(what, " ", "")+"-ms")
	c.cells[what] = fmt.Sprintf("%.2f s", d.Seconds())
	return true
}

// snapshot lists the group: each partition's owner.
func (c *w5Cell) snapshot() map[int]string {
	st, err := recipe.ReadGroup(context.Background(), c.client, c.group)
	if err != nil {
		c.b.Fatal(err)
	}
	return st.Owners
}

// heldBy counts id's partitions in a snapshot.
func (c *w5Cell) heldBy(owners map[int]string, id string) int {
	n := 0
	for _, o := range owners {
		if o == id {
			n++
		}
	}
	return n
}

// acquired is every member's Stats.Acquired and Stats.HandOffs, by
// member.
func (c *w5Cell) acquired() map[string][2]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][2]uint64{}
	for id, pr := range c.procs {
		out[id] = [2]uint64{pr.acquired, pr.handoffs}
	}
	return out
}

// moves is the report's cell for a change's moves, up to the minimum's
// parenthesis: grants, hand-offs (a grant with no hand-off is a free
// partition taken: the leaver's, or one whose lease was lost), owners
// changed, and the minimum.
func (c *w5Cell) moves(before map[int]string, acq map[string][2]uint64, minimum int) string {
	var grants, handoffs uint64
	for id, n := range c.acquired() {
		grants += n[0] - acq[id][0]
		handoffs += n[1] - acq[id][1]
	}
	changed := 0
	for p, o := range c.snapshot() {
		if before[p] != o {
			changed++
		}
	}
	c.b.ReportMetric(float64(grants), "grants")
	return fmt.Sprintf("%d grants, %d hand-offs, %d changed (%d", grants, handoffs, changed, minimum)
}

// rest measures the group at rest: requests per member per renewal
// period, CPU and RSS per member process.
func (c *w5Cell) rest(ids []string) {
	window := w5Duration(c.b, "W5_REST", 10*time.Second)
	time.Sleep(c.ttl) // the formation's tries and hand-offs are over
	pids := make([]int, len(ids))
	for i, id := range ids {
		pids[i] = c.procs[id].cmd.Process.Pid
	}
	cpu0 := w5CPU(pids)
	before := c.count(c.b)
	start := time.Now()
	time.Sleep(window)
	after := c.count(c.b)
	elapsed := time.Since(start)
	cpu1 := w5CPU(pids)
	periods := float64(elapsed) / float64(c.ttl/3)
	per := func(v float64) float64 { return v / float64(c.n) / periods }
	total := per(after.total - before.total)
	type kind struct {
		name string
		v    float64
	}
	var kinds []kind
	for k, v := range after.kinds {
		if d := per(v - before.kinds[k]); d > 0.05 {
			kinds = append(kinds, kind{k, d})
		}
	}
	slices.SortFunc(kinds, func(x, y kind) int { return -cmpFloat(x.v, y.v) })
	var parts []string
	for i, k := range kinds {
		if i == 5 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", strings.ReplaceAll(k.name, "|", `\|`), k.v))
	}
	var rss, rssMax float64
	for _, pid := range pids {
		r := w5RSS(pid)
		rss += r
		rssMax = max(rssMax, r)
	}
	cpu := (cpu1 - cpu0) / float64(len(pids)) / elapsed.Seconds() * 100
	c.b.ReportMetric(total, "req/member/period")
	c.b.ReportMetric(cpu, "cpu%/member")
	c.b.ReportMetric(rss/float64(len(pids)), "rss-MB/member")
	c.cells["req/member/period at rest"] = fmt.Sprintf("%.1f (%s)", total, strings.Join(parts, ", "))
	c.cells["CPU/member at rest"] = fmt.Sprintf("%.1f %%", cpu)
	c.cells["RSS/member"] = fmt.Sprintf("%.0f MB (max %.0f)", rss/float64(len(pids)), rssMax)
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// w5CPU is the CPU seconds (user + system) the processes used so far.
func w5CPU(pids []int) float64 {
	var s float64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: state is 3, utime 14, stime 15.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		s += (u + k) / 100 // USER_HZ
	}
	return s
}

// w5RSS is a process's resident memory, in MB.
func w5RSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// w5Load is the machine's 1-minute load average.
func w5Load() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// w5JoinPlan is the number of partitions the default throttle moves to
// a newcomer joining members (whose partitions owners lists): the
// newcomer's target is ⌊P/(N+1)⌋; the P mod (N+1) members holding the
// most get ⌈P/(N+1)⌉, the others ⌊P/(N+1)⌋; while some member is more
// than 10 % of its target from it, each member over its target hands
// off ⌈0.8·excess⌉, at most ⌈P/4⌉ in all per wave (round-robin).
func w5JoinPlan(owners map[int]string, members []string, p int) int {
	n := len(members) + 1
	counts := make([]int, len(members))
	for i, id := range members {
		for _, o := range owners {
			if o == id {
				counts[i]++
			}
		}
	}
	order := make([]int, len(members))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return counts[y] - counts[x] })
	target := make([]int, len(members))
	for r, i := range order {
		target[i] = p / n
		if r < p%n {
			target[i]++
		}
	}
	newT, got := p/n, 0
	for {
		outside := math.Abs(float64(got-newT)) > 0.1*float64(newT)
		for i := range counts {
			outside = outside || math.Abs(float64(counts[i]-target[i])) > 0.1*float64(target[i])
		}
		if !outside {
			return got
		}
		budget := (p + 3) / 4
		wave := make([]int, len(counts))
		for i := range counts {
			if e := counts[i] - target[i]; e > 0 {
				wave[i] = int(math.Ceil(0.8*float64(e) - 1e-9))
			}
		}
		moved := 0
		for rank := 0; moved < budget; rank++ {
			took := false
			for i := range wave {
				if wave[i] > rank && moved < budget {
					counts[i]--
					moved++
					took = true
				}
			}
			if !took {
				break
			}
		}
		if moved == 0 {
			return got
		}
		got += moved
	}
}

// report logs the cell's row and appends it to W5_OUT, if set.
func (c *w5Cell) report() {
	row := make([]string, len(w5Header))
	for i, h := range w5Header {
		row[i] = c.cells[h]
		if row[i] == "" {
			row[i] = "not run"
		}
	}
	line := "| " + strings.Join(row, " | ") + " |"
	c.b.Log(line)
	path := os.Getenv("W5_OUT")
	if path == "" {
		return
	}
	head := "| " + strings.Join(w5Header, " | ") + " |"
	had, _ := os.ReadFile(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.b.Fatal(err)
	}
	defer f.Close()
	if !strings.Contains(string(had), head) {
		fmt.Fprintf(f, "%s\n|%s\n", head, strings.Repeat(" --- |", len(w5Header)))
	}
	fmt.Fprintln(f, line)
}
