package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// shapeGroup is a partitions group of `fenced partitions run` members on
// PostgreSQL whose commands each append their fence to a file of their
// partition every 200ms.
type shapeGroup struct {
	t       *testing.T
	pg      *testenv.Postgres
	store   string
	dir     string
	p       int
	ttl     time.Duration
	members map[string]*memberProc
}

// shapePool is the size of each member's connection pool
// (pool_max_conns).
const shapePool = 3

type memberProc struct {
	pid  int
	errb outFile
}

func newShapeGroup(t *testing.T, p, members int, ttl time.Duration) *shapeGroup {
	t.Helper()
	pg := testenv.StartPostgres(t)
	s := &shapeGroup{t: t, pg: pg, store: pg.URL("pool_max_conns=" + strconv.Itoa(shapePool)), dir: t.TempDir(), p: p, ttl: ttl, members: map[string]*memberProc{}}
	// sh's own loop: one fork (sleep) a write, so that P commands on a
	// busy machine stay cheap.
	script := `while :; do echo "$FENCED_FENCE" >> "$0/$FENCED_PARTITION"; sleep 0.2; done`
	for i := range members {
		id := fmt.Sprintf("m%d", i)
		cmd, _, errb := startRun(t, s.store, "-v", "partitions", "run", "g", "-p", strconv.Itoa(p), "--ttl", ttl.String(),
			"--grace", (ttl / 3).String(), "--id", id, "--", "sh", "-c", script, s.dir)
		s.members[id] = &memberProc{pid: cmd.Process.Pid, errb: errb}
		// Before the files go (cleanups run last first): the member
		// leaves, and its commands are gone when it has exited.
		t.Cleanup(func() {
			if cmd.Process.Signal(syscall.SIGTERM) == nil {
				waitExit(t, cmd, 60*time.Second)
			}
		})
	}
	return s
}

// lastFence returns the fence partition i's commands wrote last, or 0.
func (s *shapeGroup) lastFence(i int) uint64 {
	b, _ := os.ReadFile(filepath.Join(s.dir, strconv.Itoa(i)))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	f, _ := strconv.ParseUint(lines[len(lines)-1], 10, 64)
	return f
}

// awaitAllWritten waits until every partition's file has a write, and
// returns each partition's last fence.
func (s *shapeGroup) awaitAllWritten(d time.Duration) map[int]uint64 {
	s.t.Helper()
	fences := map[int]uint64{}
	eventually(s.t, d, "every partition written", func() bool {
		for i := range s.p {
			f := s.lastFence(i)
			if f == 0 {
				return false
			}
			fences[i] = f
		}
		return true
	})
	return fences
}

// descendants returns the processes below pid, from /proc.
func descendants(pid int) []int {
	kids := map[int][]int{}
	for _, p := range procs() {
		kids[p.ppid] = append(kids[p.ppid], p.pid)
	}
	var out []int
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		for _, c := range kids[queue[0]] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// fencedProcs counts the processes of this binary (the fenced CLI in
// tests) at and below pid.
func fencedProcs(pid int) (n int) {
	self, _ := os.Readlink("/proc/self/exe")
	for _, p := range append([]int{pid}, descendants(pid)...) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p)); exe == self {
			n++
		}
	}
	return n
}

// storeConns returns the client ports of PostgreSQL's client connections
// to the group's database, but the one asking.
func (s *shapeGroup) storeConns() []int {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.pg.URL())
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT client_port FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	if err != nil {
		s.t.Fatal(err)
	}
	ports, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		s.t.Fatal(err)
	}
	if os.Getenv("FENCED_SHAPE_DEBUG") != "" {
		rows, _ := conn.Query(ctx, `SELECT client_port, state, backend_start::text, left(query, 60) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
		for rows.Next() {
			var port int32
			var st, bs, q string
			_ = rows.Scan(&port, &st, &bs, &q)
			s.t.Logf("conn %d %s %s %q", port, st, bs, q)
		}
	}
	var out []int
	for _, p := range ports {
		out = append(out, int(p))
	}
	return out
}

// socketPorts returns the local TCP ports of the sockets pid has open,
// from its fds and /proc/net/tcp{,6}.
func socketPorts(pid int) map[int]bool {
	inodes := map[string]bool{}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil {
			if in, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(in, "]")] = true
			}
		}
	}
	ports := map[int]bool{}
	for _, table := range []string{"tcp", "tcp6"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if port, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				ports[int(port)] = true
			}
		}
	}
	return ports
}

// TestPartitionsRunShape measures what a member of `fenced partitions
// run` costs, with 2 members of a 32-partition group on PostgreSQL and
// every partition's command running: each member is one store client,
// whose connections are at most its pool (pool_max_conns) and the
// notification listener's two, and no other process (a partition's
// supervisor) connects; and below each member run
// at most a supervisor and its guard per partition it owns, besides the
// commands.
func TestPartitionsRunShape(t *testing.T) {
	t.Parallel()
	p := 32
	if v, err := strconv.Atoi(os.Getenv("FENCED_SHAPE_P")); err == nil {
		p = v
	}
	s := newShapeGroup(t, p, 2, 5*time.Second)
	s.awaitAllWritten(60 * time.Second)
	// The counts are read while the assignment stands still: every
	// partition held, the same owners a second before and after, so no
	// supervisor is starting or ending for a move.
	type count struct{ owned, procs, conns int }
	var counts map[string]count
	var conns []int
	eventually(t, 60*time.Second, "a stable assignment to count in", func() bool {
		before := partitionOwners(t, s.store, "g")
		time.Sleep(time.Second)
		conns = s.storeConns()
		counts = map[string]count{}
		for id, m := range s.members {
			c := count{procs: fencedProcs(m.pid)}
			for _, o := range before {
				if o == id {
					c.owned++
				}
			}
			ports := socketPorts(m.pid)
			for _, port := range conns {
				if ports[port] {
					c.conns++
				}
			}
			counts[id] = c
		}
		time.Sleep(time.Second)
		after := partitionOwners(t, s.store, "g")
		return len(before) == p && maps.Equal(before, after)
	})
	ofMembers, total := 0, 0
	for id, c := range counts {
		ofMembers += c.conns
		total += c.procs
		t.Logf("member %s (pid %d): owns %d partitions; %d fenced processes and %d processes in all below it; %d store connections",
			id, s.members[id].pid, c.owned, c.procs, len(descendants(s.members[id].pid)), c.conns)
		// One client: its pool, the listener's connection and the
		// listener's spare (fencedpostgres/listen.go), whatever P is.
		if c.conns > shapePool+2 {
			t.Errorf("member %s has %d connections to the store, more than one client's (a pool of %d, the listener and its spare)",
				id, c.conns, shapePool)
		}
		if c.procs > 1+2*c.owned {
			t.Errorf("member %s: %d fenced processes for %d partitions: more than the member, and a supervisor and its guard a partition",
				id, c.procs, c.owned)
		}
	}
	if ofMembers != len(conns) {
		t.Errorf("%d store connections, of which the members hold %d: another process connects", len(conns), ofMembers)
	}
	t.Logf("P=%d, 2 members: %d fenced processes, %d PostgreSQL client connections", p, total, len(conns))
}

// TestPartitionsRunRecovery measures, with FENCED_RECOVERY_P partitions
// (default 64) on 2 members, the time from kill -9 of a member to every
// partition written again by the other, with a fence of its grant.
func TestPartitionsRunRecovery(t *testing.T) {
	if os.Getenv("FENCED_RECOVERY") == "" {
		t.Skip("a measurement (130 processes for a minute): set FENCED_RECOVERY=1 to run it")
	}
	p := 64
	if v, err := strconv.Atoi(os.Getenv("FENCED_RECOVERY_P")); err == nil {
		p = v
	}
	ttl := 3 * time.Second
	s := newShapeGroup(t, p, 2, ttl)
	s.awaitAllWritten(90 * time.Second)
	time.Sleep(3 * time.Second)
	before := map[int]uint64{}
	for i := range p {
		before[i] = s.lastFence(i)
	}
	owners := partitionOwners(t, s.store, "g")
	victim := s.members["m0"]
	owned := descendants(victim.pid)
	killed := time.Now()
	if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A partition is written again once its file grew after the kill
	// (and a second, by which the victim's commands are gone), with a
	// higher fence if the victim owned it.
	var last time.Duration
	eventually(t, 60*time.Second, "every partition written again", func() bool {
		for i := range p {
			st, err := os.Stat(filepath.Join(s.dir, strconv.Itoa(i)))
			if err != nil || !st.ModTime().After(killed.Add(time.Second)) {
				return false
			}
			if owners[i] == "m0" && s.lastFence(i) <= before[i] {
				return false
			}
		}
		last = time.Since(killed)
		return true
	})
	t.Logf("P=%d, 2 members, --ttl %v: every partition written again %v after kill -9 of a member (%d processes below it); "+
		"the survivor acquired the last of them %v after the kill",
		p, ttl, last.Round(time.Millisecond), len(owned), lastAcquired(t, s.members["m1"].errb, killed).Round(time.Millisecond))
}

// partitionOwners returns each held partition's owner (member ID), from
// `fenced partitions ls -o json`.
func partitionOwners(t *testing.T, store, group string) map[int]string {
	t.Helper()
	r := cli(t, store, "partitions", "ls", "-o", "json", group)
	if r.code != 0 {
		t.Fatalf("ls: exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		Partition []struct {
			Partition int    `json:"partition"`
			Owner     string `json:"owner"`
		} `json:"partition"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("ls: %v: %s", err, r.stdout)
	}
	owners := map[int]string{}
	for _, p := range out.Partition {
		owners[p.Partition] = p.Owner
	}
	return owners
}

// lastAcquired returns how long after since the member whose stderr is
// errb logged its last acquisition (its lines carry their time).
func lastAcquired(t *testing.T, errb outFile, since time.Time) time.Duration {
	t.Helper()
	var last time.Duration
	for _, line := range strings.Split(errb.String(), "\n") {
		stamp, rest, ok := strings.Cut(line, " ")
		if !ok || !strings.Contains(rest, "acquired partition") {
			continue
		}
		at, err := time.Parse(stampFormat, stamp)
		if err == nil && at.After(since) {
			last = max(last, at.Sub(since))
		}
	}
	return last
}
