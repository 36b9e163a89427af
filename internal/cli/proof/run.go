package proof

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Fault is a fault of the nemesis. The Go names say what each does. The
// value is its report id (M1..M15, P1): the one docs/proof.md, the recorded
// histories and the saved rows use.
type Fault string

// ID returns the fault's report id ("M1"); "" for None.
func (f Fault) ID() string { return string(f) }

// Name returns the fault's Go name ("PauseHolder"), or its id if it has
// none.
func (f Fault) Name() string {
	if n, ok := faultNames[f]; ok {
		return n
	}
	return string(f)
}

// faultNames maps each fault to its Go name, for logs and errors.
var faultNames = map[Fault]string{
	None: "None", PauseHolder: "PauseHolder", DelayWrite: "DelayWrite", KillHolder: "KillHolder",
	CutHolder: "CutHolder", PauseAuthority: "PauseAuthority", CrashAuthority: "CrashAuthority",
	FailoverReplica: "FailoverReplica", StepNodeClock: "StepNodeClock", PauseMidAcquire: "PauseMidAcquire",
	CrashLeader: "CrashLeader", PartitionPastSession: "PartitionPastSession",
	StepAuthorityClock: "StepAuthorityClock", ReorderWrites: "ReorderWrites", PartitionMinority: "PartitionMinority",
	SkewClockRate: "SkewClockRate", LoseHolderPackets: "LoseHolderPackets",
}

// The faults the nemesis injects.
const (
	// None runs the workload without a fault.
	None Fault = ""
	// PauseHolder (report id M1) pauses a holder past its TTL. The holder
	// stops itself with SIGSTOP after its last lease check, just before its
	// write. The nemesis sends SIGCONT once another worker has been granted
	// the key and has written.
	PauseHolder Fault = "M1"
	// DelayWrite (report id M2) delays a holder's write. It is sent after
	// the last lease check and reaches the resource 3 TTLs later, after the
	// holder gave up waiting for it and released. The resource is a local
	// SQLite file, so the delay is in the worker, not in a TCP link.
	DelayWrite Fault = "M2"
	// KillHolder (report id M3) kills a holder with SIGKILL mid-hold (after
	// its read, before its write); the nemesis starts a new worker in its
	// place.
	KillHolder Fault = "M3"
	// CutHolder (report id M4) cuts a holder off from the authority: its
	// proxy forwards nothing for 3 TTLs.
	CutHolder Fault = "M4"
	// PauseAuthority (report id M5) pauses the authority with SIGSTOP for 2
	// TTLs.
	PauseAuthority Fault = "M5"
	// CrashAuthority (report id M6) kills the authority with SIGKILL and
	// restarts it on its data.
	CrashAuthority Fault = "M6"
	// CrashLeader (report id M10) kills the leader of a 3-member etcd
	// cluster with SIGKILL under load. It restarts it on its data
	// (Config.Server crashes the leader).
	CrashLeader Fault = "M10"
	// PauseMidAcquire (report id M9) stops a worker with SIGSTOP for 2
	// TTLs. It does so right after its proxy forwarded the first request of
	// its next acquire, before the worker reads the reply.
	PauseMidAcquire Fault = "M9"
	// FailoverReplica (report id M7) is a Redis asynchronous failover. The
	// replica is cut off. A worker is granted the key on the primary alone
	// and held before its write. The primary is killed and the replica
	// promoted (Config.Failover). The promoted replica has not seen the
	// grant, so the next holder may get the same fence. That is a repeat,
	// declared by FenceRepeatable. Once another worker has written, the
	// first one is let go and writes.
	FailoverReplica Fault = "M7"
	// StepNodeClock (report id M8) steps one Redlock node's wall clock
	// forward by 10 TTLs (Config.Clock). It does so while a holder is held
	// before its write. The holder is let go once another worker has
	// written, or after 8 TTLs.
	StepNodeClock Fault = "M8"
	// PartitionPastSession (report id M11) partitions one holder from the
	// ZooKeeper ensemble past its session timeout. Its proxy forwards
	// nothing while the holder is held before its write. The partition
	// heals and the holder writes once another worker has written, or after
	// 8 TTLs.
	PartitionPastSession Fault = "M11"
	// StepAuthorityClock (report id M12) steps the authority's wall clock
	// forward by 10 TTLs (Config.Clock). That is more than any safety
	// margin a lease keeps. It does so while a holder is held before its
	// write, as in M8.
	StepAuthorityClock Fault = "M12"
	// ReorderWrites (report id M13) reorders the guard. Holder A stops
	// before its write (as in M1). Once B has been granted the key and has
	// read (and, claim-first, claimed) it, B is held before its write. A is
	// continued and writes, then B writes.
	ReorderWrites Fault = "M13"
	// SkewClockRate (report id M14) runs worker 0's clock at
	// Config.ClockRate times the real rate. That is a skew of rate, not a
	// step: the clock hazard of observed expiry (DynamoDB; see
	// docs/no-server-clock.md). With a slow clock (rate < 1), worker 0 is
	// the holder held before its write. Its renewals come late. The others
	// take the grant over once they have watched it unchanged for a TTL,
	// while worker 0 still trusts its lease. With a fast clock (rate > 1),
	// another worker is held, renewing. Worker 0's watch ends before the
	// next renewal, so it takes the key over. Either way the held holder
	// writes once another worker has (as in M8).
	SkewClockRate Fault = "M14"
	// LoseHolderPackets (report id M15) makes a holder's link lossy, as in
	// M11 but not a cut. The holder is held before its write while 40 % of
	// the packets to and from its host are dropped, each chosen at random.
	// This lasts until another worker has written (or after 8 TTLs); then
	// it writes. Requests and replies arrive late, after TCP's
	// retransmissions, or not at all. So its renewals may or may not keep
	// the lease. It needs a Config.Partition (packet level; a proxy cannot
	// lose single packets).
	LoseHolderPackets Fault = "M15"
)

// NeedsProxy reports whether f needs a proxy between the workers and the
// authority (a networked store).
func (f Fault) NeedsProxy() bool {
	return f == CutHolder || f == PauseMidAcquire || f == PartitionPastSession
}

// NeedsServer reports whether f acts on the authority's process.
func (f Fault) NeedsServer() bool {
	return f == PauseAuthority || f == CrashAuthority || f == CrashLeader
}

// Server lets the nemesis fault the authority's server process.
type Server interface {
	// Pause stops the server (SIGSTOP); Resume continues it. For a
	// cluster, Crash and Restart act on the member the fault names (M10:
	// the leader).
	Pause() error
	Resume() error
	// Crash kills the server with SIGKILL; Restart starts it again on its
	// data and returns once it serves.
	Crash() error
	Restart() error
}

// Failover lets the nemesis fail a primary over to its asynchronous
// replica (M7); testenv.RedisFailover is one.
type Failover interface {
	// CutReplica stops replication: nothing the primary does after it
	// returns reaches the replica.
	CutReplica() error
	// Failover kills the primary, promotes the replica and sends the
	// clients at the store's address to it; it returns once the promoted
	// replica serves (and has a replica of its own, for the next
	// injection).
	Failover() error
}

// Clock lets the nemesis step the wall clock of the authority (M12) or of
// one Redlock node (M8); testenv.WallClock is one.
type Clock interface {
	// Step moves the clock by d, forward if positive.
	Step(d time.Duration)
}

// Config describes one run.
type Config struct {
	// Store is the authority's URL.
	Store string
	// MinFence is the weakest fence the leases accept (the backend's
	// declared strength is checked against it by fenced itself).
	MinFence fenced.FenceStrength
	// Workers is the number of worker processes; default 3.
	Workers int
	// Keys are the lease keys, all under one run-specific prefix; default
	// one key.
	Keys []string
	// TTL of the leases; default 1s. Work is the time between a holder's
	// read and its write; default TTL/5.
	TTL, Work time.Duration
	// Fencing says whether the resource checks fences; Ordering is the
	// guard ordering (default ClaimFirst).
	Fencing  bool
	Ordering Ordering
	// Fault is injected Injections times (default 1), each once the
	// workload has made progress since the last.
	Fault      Fault
	Injections int
	// Server is needed for M5, M6 and M10, Failover for M7, Clock for M8
	// and M12.
	Server   Server
	Failover Failover
	Clock    Clock
	// Command returns the command that starts a worker: a binary that
	// calls MaybeRunWorker first. Its environment is extended.
	Command func() *exec.Cmd
	// Dir is the run's directory, created if needed: history.jsonl,
	// resource.db and the workers' logs stay there.
	Dir string
	// Locker, if set, names a Locker registered (with RegisterLocker) in
	// the binary Command starts: the workers lock with it instead of
	// fenced, and Store is the address it opens. It gives no fence, so
	// Fencing must be false; the checker derives the fences an ideal lock
	// would have issued (see Check).
	Locker string
	// Logf, if set, narrates the run.
	Logf func(format string, args ...any)
	// Partition, if set, places the workers on a private network and
	// cuts their links at the packet level (see Partition); fault P1
	// needs it. Declared, if set, is the backend's declared fence
	// strength, which Run otherwise asks the store for.
	Partition Partition
	Declared  *fenced.FenceStrength
	// ClockRate is the rate worker 0's clock runs at under SkewClockRate
	// (0.25: a quarter of the real rate; 4: four times it).
	ClockRate float64
}

// Result is a checked run.
type Result struct {
	Config Config
	Report Report
	// Events is the history, in time order.
	Events []Event
}

type run struct {
	cfg     Config
	rec     *Recorder
	mu      sync.Mutex
	events  []Event
	changed chan struct{}
	workers
}

// Run runs the workload with the nemesis and checks the history.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Workers == 0 {
		cfg.Workers = 3
	}
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	if cfg.Work == 0 {
		cfg.Work = cfg.TTL / 5
	}
	if cfg.Ordering == "" {
		cfg.Ordering = ClaimFirst
	}
	if cfg.Injections == 0 {
		cfg.Injections = 1
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	switch {
	case len(cfg.Keys) == 0:
		return nil, errors.New("proof: Config.Keys is empty")
	case cfg.Command == nil:
		return nil, errors.New("proof: Config.Command is nil")
	case cfg.Fault.NeedsServer() && cfg.Server == nil:
		return nil, fmt.Errorf("proof: fault %s needs Config.Server", cfg.Fault)
	case cfg.Fault == FailoverReplica && cfg.Failover == nil:
		return nil, errors.New("proof: fault M7 needs Config.Failover")
	case (cfg.Fault == StepNodeClock || cfg.Fault == StepAuthorityClock) && cfg.Clock == nil:
		return nil, fmt.Errorf("proof: fault %s needs Config.Clock", cfg.Fault)
	case cfg.Fault == PartitionMinority && cfg.Partition == nil:
		return nil, errors.New("proof: fault P1 needs Config.Partition")
	case cfg.Fault == LoseHolderPackets && cfg.Partition == nil:
		return nil, errors.New("proof: fault M15 needs Config.Partition")
	case cfg.Fault == SkewClockRate && (cfg.ClockRate <= 0 || cfg.ClockRate == 1):
		return nil, fmt.Errorf("proof: fault %s needs a Config.ClockRate other than 1, not %v", cfg.Fault.Name(), cfg.ClockRate)
	case cfg.Locker != "" && cfg.Fencing:
		return nil, fmt.Errorf("proof: Locker %q gives no fence; Config.Fencing must be false", cfg.Locker)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	strength := fenced.FenceNone
	if cfg.Declared != nil {
		strength = *cfg.Declared
	} else if cfg.Locker == "" {
		var err error
		if strength, err = declaredFence(ctx, cfg.Store); err != nil {
			return nil, err
		}
	}
	res, err := OpenResource(filepath.Join(cfg.Dir, resourceFile))
	if err != nil {
		return nil, err
	}
	defer res.Close()
	if err := res.Setup(ctx, cfg.Keys); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, changed: make(chan struct{}), workers: newWorkers(cfg.Dir)}
	if r.rec, err = OpenRecorder(filepath.Join(cfg.Dir, historyFile), -1); err != nil {
		return nil, err
	}
	defer r.rec.Close()
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	go r.tail(tailCtx)
	defer r.closeProxies()
	for i := 0; i < cfg.Workers; i++ {
		if err := r.startWorker(i); err != nil {
			r.stopWorkers()
			return nil, err
		}
	}
	nemErr := r.nemesis(ctx)
	r.stopWorkers()
	stopTail()
	events, err := ReadHistory(filepath.Join(cfg.Dir, historyFile))
	if err != nil {
		return nil, err
	}
	contents, err := res.Contents(ctx)
	if err != nil {
		return nil, err
	}
	rep := Check(events, contents, strength)
	return &Result{Config: cfg, Report: rep, Events: events}, nemErr
}

// declaredFence returns the fence strength the store's backend declares.
func declaredFence(ctx context.Context, store string) (fenced.FenceStrength, error) {
	strength, _, err := declared(ctx, store)
	return strength, err
}

// declared returns, from one connection to store, the fence strength its
// backend declares and how long it keeps a grant that is no longer renewed
// (Capabilities.Keeps: etcd rounds a session up and sweeps expiries, so it
// keeps a 5 s grant up to 6.5 s; zero on a store that ends grants at their
// TTL).
func declared(ctx context.Context, store string) (fenced.FenceStrength, driver.Expiry, error) {
	c, err := fenced.Open(ctx, store, nil)
	if err != nil {
		return 0, driver.Expiry{}, err
	}
	defer c.Close()
	return c.Capabilities().Fence, c.Capabilities().Keeps, nil
}

func (r *run) tail(ctx context.Context) {
	path := filepath.Join(r.cfg.Dir, historyFile)
	var off int64
	var partial []byte
	for ctx.Err() == nil {
		f, err := os.Open(path)
		if err == nil {
			st, _ := f.Stat()
			if st != nil && st.Size() > off {
				buf := make([]byte, st.Size()-off)
				n, _ := f.ReadAt(buf, off)
				off += int64(n)
				partial = append(partial, buf[:n]...)
				var add []Event
				for {
					i := strings.IndexByte(string(partial), '\n')
					if i < 0 {
						break
					}
					var e Event
					if json.Unmarshal(partial[:i], &e) == nil {
						add = append(add, e)
					}
					partial = partial[i+1:]
				}
				if len(add) > 0 {
					r.mu.Lock()
					r.events = append(r.events, add...)
					close(r.changed)
					r.changed = make(chan struct{})
					r.mu.Unlock()
				}
			}
			f.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// waitEvent waits for an event recorded at or after index from that
// matches, and returns it with its index.
func (r *run) waitEvent(ctx context.Context, from int, timeout time.Duration, match func(Event) bool) (Event, int, error) {
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		evs, ch := r.events, r.changed
		r.mu.Unlock()
		for i := from; i < len(evs); i++ {
			if match(evs[i]) {
				return evs[i], i, nil
			}
		}
		from = max(from, len(evs))
		select {
		case <-ch:
		case <-deadline:
			return Event{}, from, fmt.Errorf("proof: waited %v for an event that did not come", timeout)
		case <-ctx.Done():
			return Event{}, from, ctx.Err()
		}
	}
}

func (r *run) eventCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *run) startWorker(i int) error {
	store := r.cfg.Store
	if r.cfg.Fault.NeedsProxy() && r.cfg.Partition == nil {
		var err error
		if store, err = r.proxied(i, store); err != nil {
			return err
		}
	}
	wc := WorkerConfig{Worker: i, Store: store, Keys: r.cfg.Keys, TTL: r.cfg.TTL, Work: r.cfg.Work, Fencing: r.cfg.Fencing,
		Ordering: r.cfg.Ordering, MinFence: r.cfg.MinFence, Dir: r.cfg.Dir, Locker: r.cfg.Locker}
	if r.cfg.Fault == SkewClockRate && i == 0 {
		wc.ClockRate = r.cfg.ClockRate
	}
	raw, err := json.Marshal(wc)
	if err != nil {
		return err
	}
	cmd := r.cfg.Command()
	cmd.Env = append(os.Environ(), envWorker+"="+string(raw))
	return r.start(i, cmd, func() {
		if r.cfg.Partition != nil {
			r.cfg.Partition.Place(i, cmd)
		}
	})
}

// stopWorkers asks every worker to finish its round and exit, and kills
// the ones that do not within a bound.
func (r *run) stopWorkers() { r.stop(r.cfg.Workers, 10*r.cfg.TTL+20*time.Second, r.cfg.Logf) }

// isStopped reports whether pid is stopped by a signal.
func isStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

func (r *run) record(e Event) {
	if err := r.rec.Record(e); err != nil {
		r.cfg.Logf("proof: %v", err)
	}
}

// arm writes an arming file for a worker (or any worker, w < 0).
func (r *run) arm(point string, w int, action string) error {
	name := "arm-" + point
	if w >= 0 {
		name += fmt.Sprintf("-w%d", w)
	}
	tmp := filepath.Join(r.cfg.Dir, name+".tmp")
	if err := os.WriteFile(tmp, []byte(action), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.cfg.Dir, name))
}

func (r *run) disarm(point string, w int) {
	name := "arm-" + point
	if w >= 0 {
		name += fmt.Sprintf("-w%d", w)
	}
	os.Remove(filepath.Join(r.cfg.Dir, name))
}
