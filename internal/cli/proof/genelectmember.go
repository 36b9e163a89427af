package proof

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// The elector process of the generative elector proof (RunGenElect): it
// runs the registered Elector (client-go's leaderelection.RunOrDie over a
// fencedk8s.ResourceLock, registered by fencedk8s's module, which the
// core module does not require) until killed. While it leads it samples,
// every 10ms, the context it works under (LeaderContext's; with the
// hazard switch the elector's own) and the elector's context, and writes
// a fenced resource with the term's fence.

// Elector runs one elector process of the generative elector proof until
// the process is killed. It elects among the processes of cfg.Election on
// c, as id. For each term it leads, it calls lead in the elector's
// callback. elector is the context the elector ends with the term. work is
// the one its user works under. l is the term's lease, nil if the elector
// found none. It returns only on an error.
type Elector func(c *fenced.Client, id string, cfg GenElectMemberConfig, lead func(elector, work context.Context, l *fenced.Lease)) error

var (
	electorMu sync.Mutex
	elector   Elector
)

// RegisterElector makes e the elector of the generative elector proof's
// processes. Register before MaybeRunWorker, in TestMain or init, in the
// binary that GenElectConfig.Command starts. It panics if e is nil or an
// elector is registered already.
func RegisterElector(e Elector) {
	electorMu.Lock()
	defer electorMu.Unlock()
	if e == nil {
		panic("proof: RegisterElector with a nil Elector")
	}
	if elector != nil {
		panic("proof: an Elector is registered twice")
	}
	elector = e
}

func registeredElector() (Elector, error) {
	electorMu.Lock()
	defer electorMu.Unlock()
	if elector == nil {
		return nil, errors.New("proof: no Elector is registered in this binary (RegisterElector)")
	}
	return elector, nil
}

// envGenElect carries an elector's GenElectMemberConfig, as JSON.
const envGenElect = "FENCED_PROOF_GENELECT"

// GenElectMemberConfig is what one elector process needs.
type GenElectMemberConfig struct {
	Slot     int                  `json:"slot"`
	Store    string               `json:"store"`
	Election string               `json:"election"`
	MinFence fenced.FenceStrength `json:"min_fence"`
	Dir      string               `json:"dir"`
	// The elector's timing (client-go's LeaderElectionConfig and
	// fencedk8s.Options).
	LeaseDuration time.Duration `json:"lease_duration"`
	RenewDeadline time.Duration `json:"renew_deadline"`
	RetryPeriod   time.Duration `json:"retry_period"`
	// IgnoreLeaderContext is the test-only hazard switch: the leader
	// works under the elector's context alone, as without fencedk8s's
	// LeaderContext.
	IgnoreLeaderContext bool `json:"ignore_leader_context,omitempty"`
}

// electEvent is one line of an elector run's history (genElectHistory).
type electEvent struct {
	// K is "s" (a sample of a leader's contexts), "lead" (a term began:
	// TTL is its lease's), "nolease" (OnStartedLeading found no lease),
	// "end" (a term's work and sampling ended: Refused writes), "fault"
	// (the nemesis's, from T to End) or "start" (an elector process
	// started).
	K string `json:"k"`
	// T is CLOCK_MONOTONIC (Now) right after the sample's checks; TB
	// right before them.
	T     int64  `json:"t"`
	TB    int64  `json:"tb,omitempty"`
	Slot  int    `json:"slot"`
	PID   int    `json:"pid"`
	Fence uint64 `json:"f,omitempty"`
	// W and CG say whether the work context and client-go's were live.
	W  bool `json:"w,omitempty"`
	CG bool `json:"cg,omitempty"`
	// TTL is the term's lease TTL ("lead"); Refused the term's writes the
	// guard refused ("end").
	TTL     time.Duration `json:"ttl,omitempty"`
	Refused int           `json:"refused,omitempty"`
	// Fault, End and Hurt describe a fault: its kind, when it ended, and
	// whether it struck the leader (whose term is Fence).
	Fault string `json:"fault,omitempty"`
	End   int64  `json:"end,omitempty"`
	Hurt  bool   `json:"hurt,omitempty"`
	Err   string `json:"err,omitempty"`
}

// Files of an elector run, in its directory.
const (
	genElectHistory  = "elect-history.jsonl"
	genElectResource = "elect-resource.db"
)

// electRecorder appends electEvents to the history shared by the run's
// processes: one write(2) per line, O_APPEND.
type electRecorder struct {
	mu sync.Mutex
	f  *os.File
}

func openElectRecorder(path string) (*electRecorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("proof: open history: %w", err)
	}
	return &electRecorder{f: f}, nil
}

func (r *electRecorder) record(e electEvent) {
	if e.T == 0 {
		e.T = Now()
	}
	if e.PID == 0 {
		e.PID = os.Getpid()
	}
	b, _ := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "proof elector:", err)
		os.Exit(1)
	}
}

// Sampling and writing periods of a leader.
const (
	electSampleEvery = 10 * time.Millisecond
	electWriteEvery  = 20 * time.Millisecond
)

// runGenElectMember runs one elector until killed.
func runGenElectMember(cfg GenElectMemberConfig) int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "proof elector:", err)
		return 1
	}
	run, err := registeredElector()
	if err != nil {
		return fail(err)
	}
	rec, err := openElectRecorder(cfg.Dir + "/" + genElectHistory)
	if err != nil {
		return fail(err)
	}
	res, err := openPartResource(cfg.Dir + "/" + genElectResource)
	if err != nil {
		return fail(err)
	}
	c, err := fenced.Open(ctx, cfg.Store, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	pid := os.Getpid()
	id := "e" + strconv.Itoa(cfg.Slot) + "-" + strconv.Itoa(pid)
	rec.record(electEvent{K: "start", Slot: cfg.Slot})
	lead := func(cg, lc context.Context, l *fenced.Lease) {
		if l == nil {
			rec.record(electEvent{K: "nolease", Slot: cfg.Slot})
			return
		}
		work := lc
		if cfg.IgnoreLeaderContext {
			work = cg
		}
		f := l.Fence()
		rec.record(electEvent{K: "lead", Slot: cfg.Slot, Fence: f, TTL: l.Options().TTL})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the sampler
			defer wg.Done()
			for {
				tb := Now()
				w, g := work.Err() == nil, cg.Err() == nil
				rec.record(electEvent{K: "s", T: Now(), TB: tb, Slot: cfg.Slot, Fence: f, W: w, CG: g})
				if !w && !g {
					return
				}
				time.Sleep(electSampleEvery)
			}
		}()
		// The writer: guarded by the term's fence, and once more after the
		// work context ended, so that the resource, not the leader's
		// belief, must refuse a stale write.
		tok := fence.From(l)
		refused := 0
		for {
			done := work.Err() != nil
			w := partWrite{Part: 0, P: 1, Fence: f, PID: int64(pid), Member: id, T: Now(), Live: !done}
			wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			ok, err := res.write(wctx, w, tok)
			cancel()
			if err == nil && !ok {
				refused++
			}
			if done {
				break
			}
			select {
			case <-work.Done():
			case <-time.After(electWriteEvery):
			}
		}
		wg.Wait()
		rec.record(electEvent{K: "end", Slot: cfg.Slot, Fence: f, Refused: refused})
	}
	err = run(c, id, cfg, lead)
	if err == nil {
		err = errors.New("the Elector returned")
	}
	return fail(err)
}

// maybeRunGenElectMember runs an elector and exits if this process was
// started as one.
func maybeRunGenElectMember() {
	raw := os.Getenv(envGenElect)
	if raw == "" {
		return
	}
	var cfg GenElectMemberConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof elector: bad config:", err)
		os.Exit(2)
	}
	os.Exit(runGenElectMember(cfg))
}
