package proof

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// A Locker is a lock that gives no fence: one of the libraries teams use
// today (redsync, redislock, etcd's concurrency.Mutex, go-zookeeper's
// Lock). It is driven by the same workload as fenced, so that their rows of
// the matrix can stand beside fenced's. Its holders write to the resource
// unguarded. The resource cannot tell a stale holder from the current one.
//
// Lockers live outside this package (the bench modules register them), so
// that the main module does not depend on the libraries.
type Locker interface {
	// Lock waits until the caller holds key for ttl, or ctx ends.
	Lock(ctx context.Context, key string, ttl time.Duration) (Unlocker, error)
	// Close releases the Locker's connections.
	Close() error
}

// An Unlocker is a lock a Locker granted.
type Unlocker interface {
	// Lost is closed when the library learns that the lock is lost (an
	// etcd session expiring, say); nil if the library never tells.
	Lost() <-chan struct{}
	// Unlock releases the lock.
	Unlock(ctx context.Context) error
}

// OpenLocker opens a Locker on the store at addr (whatever address the
// Locker understands; a worker behind a proxy gets the proxy's).
type OpenLocker func(ctx context.Context, addr string) (Locker, error)

var (
	lockersMu sync.Mutex
	lockers   = map[string]OpenLocker{}
)

// RegisterLocker makes a Locker available to workers under name (see
// Config.Locker). Register before MaybeRunWorker, in TestMain or init, in
// the binary that Config.Command starts. It panics if name is empty or
// already registered.
func RegisterLocker(name string, open OpenLocker) {
	lockersMu.Lock()
	defer lockersMu.Unlock()
	if name == "" || open == nil {
		panic("proof: RegisterLocker with an empty name or a nil OpenLocker")
	}
	if _, dup := lockers[name]; dup {
		panic("proof: Locker " + name + " registered twice")
	}
	lockers[name] = open
}

func lookupLocker(name string) (OpenLocker, error) {
	lockersMu.Lock()
	defer lockersMu.Unlock()
	open, ok := lockers[name]
	if !ok {
		return nil, fmt.Errorf("proof: no Locker %q is registered in this binary", name)
	}
	return open, nil
}

// deriveFences gives the grants of a fenceless lock the fences an ideal
// lock would have issued: per key, 1, 2, ... in the order the grants were
// confirmed to their holders. Every event and ledger row of a grant (known
// by its owner, unique per grant) takes its grant's fence, so the checker
// and the linearizability model judge a fenceless lock by the same rules
// as fenced: a write accepted after a later-granted holder's write is
// stale. The resource never sees these fences.
func deriveFences(events []Event, res *Contents) {
	type grant struct {
		key   string
		owner string
		ok    int64
	}
	var grants []grant
	for _, e := range events {
		if e.Kind == AcquireOK {
			grants = append(grants, grant{e.Key, e.Owner, e.T})
		}
	}
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].ok < grants[j].ok })
	next := map[string]uint64{}
	byOwner := map[string]uint64{}
	for _, g := range grants {
		next[g.key]++
		byOwner[g.owner] = next[g.key]
	}
	for i := range events {
		if f, ok := byOwner[events[i].Owner]; ok && events[i].Owner != "" {
			events[i].Fence = f
		}
	}
	for i := range res.Ledger {
		if f, ok := byOwner[res.Ledger[i].Owner]; ok {
			res.Ledger[i].Fence = f
		}
	}
}

// LockerFaults are the faults a Locker's rows run on one server: those of
// the incumbents table that apply to a client. M7 (Redis
// failover) needs a primary and a replica: bench/redis runs it on
// testenv.RedisFailover.
var LockerFaults = []Fault{PauseHolder, KillHolder, CutHolder, PauseMidAcquire}

// RunLocker runs base (whose Locker, Store and Command are set) once per
// fault, fencing off. Each run has its own subdirectory of base.Dir and its
// own key. It returns a row per fault named backend. A run that fails gives
// a row whose NA says why; the first such error is also returned.
func RunLocker(ctx context.Context, backend string, base Config, faults []Fault) ([]Row, error) {
	var rows []Row
	var first error
	for _, f := range faults {
		cfg := base
		cfg.Fault, cfg.Fencing = f, false
		cfg.Dir = filepath.Join(base.Dir, string(f))
		cfg.Keys = []string{fmt.Sprintf("fenced-proof:incumbent:%s:%s:%d", backend, f, time.Now().UnixNano())}
		row := Row{Backend: backend, Fault: f, Ordering: WriteOnly}
		res, err := Run(ctx, cfg)
		if err != nil {
			row.NA = "run failed: " + strings.ReplaceAll(err.Error(), "|", "/")
			if first == nil {
				first = fmt.Errorf("%s %s: %w", backend, f, err)
			}
		} else {
			rep := res.Report
			row.Report = &rep
		}
		rows = append(rows, row)
	}
	return rows, first
}

// WriteRows writes rows as JSON to path, for the report (see ReadRows).
func WriteRows(path string, rows []Row) error {
	raw, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// ReadRows reads rows WriteRows wrote.
func ReadRows(path string) ([]Row, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []Row
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("proof: %s: %w", path, err)
	}
	return rows, nil
}
