package proof

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/recipe"
)

// The member process of the generative partitions proof (RunGenPartitions):
// it joins the group with the partition count it was started with, and
// each partition it owns works the items routed to it, as users route
// them: item → partition hash(item) mod P. Every work step writes the
// resource, guarded by the partition lease's fence on the partition's row,
// and logs (member, P, partition, fence, item) in the same transaction.

// envGenPart carries a member's GenPartMemberConfig, as JSON.
const envGenPart = "FENCED_PROOF_GENPART"

// Exit codes of a member that stopped by itself.
const (
	exitPartitionCount = 3 // recipe.ErrPartitionCount, at its join or later
	exitMemberLive     = 4 // recipe.ErrMemberLive at its join
)

// GenPartMemberConfig is what one member process needs.
type GenPartMemberConfig struct {
	Slot     int                  `json:"slot"`
	Member   string               `json:"member"`
	P        int                  `json:"p"`
	Items    int                  `json:"items"`
	Store    string               `json:"store"`
	Group    string               `json:"group"`
	TTL      time.Duration        `json:"ttl"`
	MinFence fenced.FenceStrength `json:"min_fence"`
	Dir      string               `json:"dir"`
	// Weight and the rebalancing knobs (recipe.PartitionsOptions).
	Weight          int     `json:"weight"`
	Threshold       float64 `json:"threshold"`
	Dampening       float64 `json:"dampening"`
	MaxInTransition int     `json:"max_in_transition"`
}

// itemPartition routes item to its partition of p, as a user would: FNV-1a
// of the item's name, mod p.
func itemPartition(item, p int) int {
	h := fnv.New64a()
	h.Write([]byte("item-" + strconv.Itoa(item)))
	return int(h.Sum64() % uint64(p))
}

// partEvent is one line of a partitions run's history (genPartHistory).
type partEvent struct {
	// K is "own" (the work of a partition started: its lease is granted),
	// "end" (its work returned), "exit" (the member stopped by itself).
	K      string `json:"k"`
	T      int64  `json:"t"` // CLOCK_MONOTONIC (Now)
	Slot   int    `json:"slot"`
	PID    int    `json:"pid"`
	Member string `json:"m,omitempty"`
	P      int    `json:"p,omitempty"`
	Part   int    `json:"part"`
	Fence  uint64 `json:"f,omitempty"`
	// Live is the last instant (Now) the member saw the lease valid and
	// its context live ("end").
	Live int64 `json:"live,omitempty"`
	// Refused counts the ownership's writes the guard refused ("end").
	Refused int    `json:"refused,omitempty"`
	Err     string `json:"err,omitempty"`
	// CP is the checkpoint the work started from ("own"), or the one it
	// tries to record ("cptry", then "cp" with Res: "ok", "refused" for
	// ErrNotHeld, "err" for any other error: its outcome unknown).
	CP  string `json:"cp,omitempty"`
	Res string `json:"res,omitempty"`
}

// partRecorder appends partEvents to a history file shared by the run's
// processes: one write(2) per line, O_APPEND.
type partRecorder struct {
	mu sync.Mutex
	f  *os.File
}

func openPartRecorder(path string) (*partRecorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("proof: open history: %w", err)
	}
	return &partRecorder{f: f}, nil
}

func (r *partRecorder) record(e partEvent) {
	if e.T == 0 {
		e.T = Now()
	}
	e.PID = os.Getpid()
	b, _ := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "proof member:", err)
		os.Exit(1)
	}
}

// partResource is the resource of a partitions run: a SQLite file whose
// table part has one row per partition index, guarded by fence.SQL, and
// worklog one row per accepted write, in commit order.
type partResource struct {
	db    *sql.DB
	guard *fence.SQL
}

// openRow makes a row's directory dir, reads what store declares of its
// expiry, and opens the row's resource, named name in dir.
func openRow(ctx context.Context, dir, store, name string) (driver.Expiry, *partResource, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return driver.Expiry{}, nil, err
	}
	_, keeps, err := declared(ctx, store)
	if err != nil {
		return driver.Expiry{}, nil, err
	}
	res, err := openPartResource(filepath.Join(dir, name))
	return keeps, res, err
}

func openPartResource(path string) (*partResource, error) {
	db, err := openResourceDB(path)
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(0) // no connection of a stopped member holds a lock
	g, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "part", Key: "p"}, nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &partResource{db: db, guard: g}, nil
}

// setup creates the tables and a row for each partition index below n.
func (r *partResource) setup(ctx context.Context, n int) error {
	for _, s := range []string{
		`CREATE TABLE IF NOT EXISTS part (p INTEGER PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS worklog (seq INTEGER PRIMARY KEY AUTOINCREMENT, p INTEGER NOT NULL, pcount INTEGER NOT NULL, ` +
			`fence INTEGER NOT NULL, pid INTEGER NOT NULL, member TEXT NOT NULL, item INTEGER NOT NULL, t INTEGER NOT NULL, ` +
			`live INTEGER NOT NULL)`,
	} {
		if _, err := r.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("proof: set up resource: %w", err)
		}
	}
	if err := r.guard.EnsureColumns(ctx); err != nil {
		return err
	}
	for i := range n {
		if _, err := r.db.ExecContext(ctx, `INSERT OR IGNORE INTO part (p) VALUES (?)`, i); err != nil {
			return fmt.Errorf("proof: set up resource: %w", err)
		}
	}
	return nil
}

// partWrite is one accepted write, as the worklog holds it.
type partWrite struct {
	Seq, PID      int64
	Part, P, Item int
	Fence         uint64
	Member        string
	T             int64
	Live          bool
}

// write works item under partition part's lease (token t, count p): a
// guarded update of the partition's row and a worklog row, in one
// transaction. It reports whether the guard accepted it.
func (r *partResource) write(ctx context.Context, w partWrite, t fence.Token) (bool, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := r.guard.Update(ctx, tx, w.Part, t, fence.Write{Set: "n = n + 1"})
	if err != nil || !res.Applied() {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO worklog (p, pcount, fence, pid, member, item, t, live) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		w.Part, w.P, int64(w.Fence), w.PID, w.Member, w.Item, w.T, boolInt(w.Live)); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// writes returns every accepted write, in commit order.
func (r *partResource) writes(ctx context.Context) ([]partWrite, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT seq, p, pcount, fence, pid, member, item, t, live FROM worklog ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ws []partWrite
	for rows.Next() {
		var w partWrite
		var f, live int64
		if err := rows.Scan(&w.Seq, &w.Part, &w.P, &f, &w.PID, &w.Member, &w.Item, &w.T, &live); err != nil {
			return nil, err
		}
		w.Fence, w.Live = uint64(f), live == 1
		ws = append(ws, w)
	}
	return ws, rows.Err()
}

// partWriteEvery is how often a partition's work writes.
const partWriteEvery = 15 * time.Millisecond

// partRoutes returns the items of each of p partitions, of items items.
func partRoutes(items, p int) [][]int {
	routes := make([][]int, p)
	for i := range items {
		k := itemPartition(i, p)
		routes[k] = append(routes[k], i)
	}
	return routes
}

// partCheckpointEvery is how many writes a partition's work makes per
// checkpoint.
const partCheckpointEvery = 4

// recordCheckpoint records checkpoint "fence:step" under l, and the try
// and its outcome in the history (own names the ownership).
func recordCheckpoint(rec *partRecorder, own partEvent, l *fenced.Lease, step int) {
	v := fmt.Sprintf("%d:%d", l.Fence(), step)
	try := own
	try.K, try.T, try.CP = "cptry", 0, v
	rec.record(try)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := l.Checkpoint(ctx, []byte(v))
	cancel()
	done := try
	done.K, done.T, done.Res = "cp", 0, "ok"
	switch {
	case errors.Is(err, fenced.ErrNotHeld):
		done.Res = "refused"
	case err != nil:
		done.Res, done.Err = "err", err.Error()
	}
	rec.record(done)
}

// openPartStore opens the member's store. A member stopped (SIGSTOP)
// while it opens, past the open's probe, finds the store unavailable: it
// opens again, as a supervisor would restart it, for as long as a stop
// lasts (3 TTLs).
func openPartStore(ctx context.Context, cfg GenPartMemberConfig) (*fenced.Client, error) {
	for giveUp := time.Now().Add(3 * cfg.TTL); ; {
		c, err := fenced.Open(ctx, cfg.Store, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
		if err == nil || !errors.Is(err, fenced.ErrUnavailable) || time.Now().After(giveUp) {
			return c, err
		}
		fmt.Fprintln(os.Stderr, "proof member: open again:", err)
	}
}

// runGenPartMember runs one member until SIGTERM (it leaves) or until it
// stops by itself.
func runGenPartMember(cfg GenPartMemberConfig) int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "proof member:", err)
		return 1
	}
	rec, err := openPartRecorder(cfg.Dir + "/" + genPartHistory)
	if err != nil {
		return fail(err)
	}
	res, err := openPartResource(cfg.Dir + "/" + genPartResource)
	if err != nil {
		return fail(err)
	}
	c, err := openPartStore(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	routes := partRoutes(cfg.Items, cfg.P)
	pid := int64(os.Getpid())
	checkpoints := c.Capabilities().Checkpoint
	work := func(ctx context.Context, p recipe.Partition) error {
		own := partEvent{K: "own", Slot: cfg.Slot, Member: cfg.Member, P: cfg.P, Part: p.Index, Fence: p.Lease.Fence(),
			CP: string(p.Checkpoint)}
		rec.record(own)
		end := own
		end.K = "end"
		defer func() { rec.record(end) }()
		tok := fence.From(p.Lease)
		items := routes[p.Index]
		for k := 0; ; k++ {
			// One write after the context ended too: the resource, not the
			// member's belief, must refuse a stale one.
			done := ctx.Err() != nil
			t := Now()
			// Live at t: the context (which ends before the lease is
			// released) was live after t, and the local validity, which
			// ends before the authority's grant, reached past t.
			live := !done && rootaccess.ValidUntil(p.Lease).After(time.Now()) && ctx.Err() == nil
			if live {
				end.Live = t
			}
			if len(items) > 0 {
				w := partWrite{Part: p.Index, P: cfg.P, Item: items[k%len(items)], Fence: p.Lease.Fence(), PID: pid, Member: cfg.Member,
					T: t, Live: live}
				wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				ok, err := res.write(wctx, w, tok)
				cancel()
				if err == nil && !ok {
					end.Refused++
				}
			}
			if checkpoints && (k%partCheckpointEvery == 0 || done) {
				// After the context ended too: the store, not the member's
				// belief, must refuse a stale checkpoint.
				recordCheckpoint(rec, own, p.Lease, k)
			}
			if done {
				return nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(partWriteEvery):
			}
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	m, err := recipe.JoinPartitions(ctx, c, cfg.Group, cfg.P, work, &recipe.PartitionsOptions{
		MemberID: cfg.Member, Lease: &fenced.LeaseOptions{TTL: cfg.TTL, MinFence: cfg.MinFence},
		Weight: cfg.Weight, RebalanceThreshold: cfg.Threshold, Dampening: cfg.Dampening, MaxInTransition: cfg.MaxInTransition})
	code := func(err error) int {
		rec.record(partEvent{K: "exit", Slot: cfg.Slot, Member: cfg.Member, P: cfg.P, Err: err.Error()})
		fmt.Fprintln(os.Stderr, "proof member:", err)
		switch {
		case errors.Is(err, recipe.ErrPartitionCount):
			return exitPartitionCount
		case errors.Is(err, recipe.ErrMemberLive):
			return exitMemberLive
		}
		return 1
	}
	if err != nil {
		return code(err)
	}
	select {
	case <-sigs:
		if err := m.Leave(ctx); err != nil {
			return code(err)
		}
		return 0
	case <-m.Done():
		err := m.Leave(ctx)
		if err == nil {
			err = errors.New("the member stopped by itself with no error")
		}
		return code(err)
	}
}

// maybeRunGenPartMember runs a partitions member and exits if this process
// was started as one.
func maybeRunGenPartMember() {
	raw := os.Getenv(envGenPart)
	if raw == "" {
		return
	}
	var cfg GenPartMemberConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof member: bad config:", err)
		os.Exit(2)
	}
	os.Exit(runGenPartMember(cfg))
}
