package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// A proof worker is this binary re-executed; it must start working before
// cobra parses anything.
func init() { proof.MaybeRunWorker() }

// proofPrefix is the only key prefix `fenced proof` uses.
const proofPrefix = "fenced-proof:"

// proofScenarioJSON is one row of `fenced proof -o json`.
type proofScenarioJSON struct {
	Fault            string `json:"fault"`
	Fencing          bool   `json:"fencing"`
	Runs             int    `json:"runs"`
	Grants           int    `json:"grants"`
	WritesAccepted   int    `json:"writes_accepted"`
	StaleAttempted   int    `json:"stale_attempted"`
	StaleRefused     int    `json:"stale_refused"`
	StaleAccepted    int    `json:"stale_accepted"`
	FenceRegressions int    `json:"fence_regressions"`
	Overlaps         int    `json:"overlaps"`
	DuplicateEffects int    `json:"duplicate_effects"`
	Linearizable     bool   `json:"linearizable"`
	HazardSeen       bool   `json:"hazard_seen"`
}

type proofJSON struct {
	Store     string              `json:"store"`
	Scenarios []proofScenarioJSON `json:"scenarios"`
}

func newProofCmd(g *globals) *cobra.Command {
	f := &proofFlags{}
	cmd := &cobra.Command{
		Use:   "proof",
		Short: "Prove the store's leases and fences under client-side faults, with worker processes",
		Long:  proofLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkProofGenFlags(f, cmd.Flags().Changed); err != nil {
				return err
			}
			if f.generative && !cmd.Flags().Changed("seed") {
				f.seed = rand.Uint64()
			}
			return runProof(cmd.Context(), g, f)
		},
	}
	addOutputFlag(cmd, g)
	cmd.Flags().BoolVar(&f.quick, "quick", false, "one injection per scenario, fencing off only for M1 (about a minute)")
	cmd.Flags().StringVar(&f.minFence, "min-fence", "",
		"weakest fence the leases accept: strict (default), repeatable (Redis with replicas) or none")
	cmd.Flags().StringVar(&f.dir, "dir", "",
		"directory for the histories and the scratch ledger (default: a new temporary directory, kept)")
	cmd.Flags().DurationVar(&f.ttl, "ttl", time.Second, "lease TTL of the workers")
	cmd.Flags().IntVar(&f.workers, "workers", 3, "worker processes")
	cmd.Flags().BoolVar(&f.generative, "generative", false,
		"run random operations under faults drawn from a seed, for --duration, instead of the fixed scenarios")
	cmd.Flags().Uint64Var(&f.seed, "seed", 0,
		"with --generative: the seed that draws the operations and the faults (default: a random one, printed)")
	cmd.Flags().DurationVar(&f.duration, "duration", proofGenDefaultDuration, "with --generative: how long the workload runs")
	return cmd
}

// proofLong is the long help of fenced proof.
const proofLong = `proof runs the client-side faults of fenced's proof matrix against the store:
worker processes (this binary, re-executed) take leases on keys under the prefix
"` + proofPrefix + `<run>:", read and append to a scratch SQLite ledger guarded by the fence,
and send an "invoice" per entry, while a nemesis pauses (M1), delays (M2), kills (M3),
cuts off (M4) and stops mid-acquire (M9) holders and reorders a stale write before the
new holder's (M13). Each fault runs with fencing on and off. A checker reads the
recorded history and the ledger: with fencing on, no stale write may be accepted,
no invoice sent twice, and the ledger must be linearizable (porcupine); with
fencing off the M1 hazard must be seen, or the checker is not believed.

M4 and M9 need a networked store (a TCP proxy is put in front of it) and are
skipped for sqlite. proof refuses to run if leases it did not create are held
under the prefix, and leaves keys only under it. --quick runs one injection per
scenario (about a minute); otherwise three.

--generative runs the generative proof instead, for --duration (default 1m):
--workers processes of 6 streams each draw from --seed (default: a random
one, printed first) a mix of Acquire, TryAcquire, Do, AcquireAll, semaphore
permits, election campaigns, cancelled acquires, breaks and pools of leases
held for several TTLs, on keys under "` + proofGenPrefix + `<seed>:<run>:", while a
nemesis drawn from the same seed stops a worker with SIGSTOP (M1) or, on a
networked store, cuts it off through its proxy (M4). Pausing (M5) or crashing
(M6) the store is left out: proof did not start it. The checker reads the
history: no fence goes backwards (or repeats, where the store's is strict), no
two owners hold a key at once, no lease lives past its local validity or a
break, no grant nobody was handed outstays its TTL, and no set reports a lost
member healthy. The report lists the operations by kind, the faults injected,
each check's count, the verdict, the command that reruns the seed (the same
operations and faults; their timing is the machine's) and the directory of the
history. Exit status: 0 on PASS, 1 on a violation (or a run that was granted
nothing), 64 on bad flags or a refused store.`

// proofFlags are the flags of fenced proof.
type proofFlags struct {
	quick    bool
	minFence string
	dir      string
	ttl      time.Duration
	workers  int
	// generative runs the generative proof (runProofGen) with seed for
	// duration.
	generative bool
	seed       uint64
	duration   time.Duration
}

// runProof runs fenced proof: it checks the prefix is free, runs the
// scenarios and prints the verdict.
func runProof(ctx context.Context, g *globals, f *proofFlags) error {
	g.noteStore()
	if err := g.checkOutput(); err != nil {
		return err
	}
	strength := fenced.FenceStrict
	if f.minFence != "" {
		var err error
		if strength, err = parseFenceStrength(f.minFence); err != nil {
			return withCode(exitUsage, fmt.Errorf("--min-fence: %w", err))
		}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := checkProofPrefix(ctx, g, strength); err != nil {
		return err
	}
	if f.dir == "" {
		if f.dir, err = os.MkdirTemp("", "fenced-proof-"); err != nil {
			return err
		}
	}
	if f.generative {
		return runProofGen(ctx, g, f, strength, self)
	}
	out, err := runProofScenarios(ctx, g, f, strength, self)
	if err != nil {
		return err
	}
	verdict, failed := proofVerdict(out.Scenarios)
	if err := printProof(g, out, verdict, f.dir); err != nil {
		return err
	}
	if failed {
		return withCode(exitError, nil)
	}
	return nil
}

// runProofScenarios runs each fault with fencing on and off (--quick: off
// for M1 only), with worker processes running self.
func runProofScenarios(ctx context.Context, g *globals, f *proofFlags, strength fenced.FenceStrength, self string) (proofJSON, error) {
	runID := fmt.Sprintf("%d", time.Now().UnixNano())
	faults := []proof.Fault{proof.PauseHolder, proof.DelayWrite, proof.KillHolder, proof.CutHolder, proof.PauseMidAcquire,
		proof.ReorderWrites}
	injections := 3
	if f.quick {
		injections = 1
	}
	out := proofJSON{Store: storeurl.Redact(g.store)}
	isSQLite := strings.HasPrefix(g.store, "sqlite:")
	for _, fault := range faults {
		if fault.NeedsProxy() && isSQLite {
			continue
		}
		for _, fencing := range []bool{true, false} {
			if f.quick && !fencing && fault != proof.PauseHolder {
				continue
			}
			name := fmt.Sprintf("%s-fencing-%v", fault, fencing)
			cfg := proof.Config{
				Store: g.store, MinFence: strength, Workers: f.workers, TTL: f.ttl,
				Keys:    []string{proofPrefix + runID + ":" + name},
				Fencing: fencing, Fault: fault, Injections: injections,
				Command: func() *exec.Cmd { return exec.Command(self) },
				Dir:     filepath.Join(f.dir, name),
			}
			if g.output == "table" {
				fmt.Fprintf(g.stderr, "running %s with fencing %s…\n", fault, onOff(fencing))
			}
			res, err := proof.Run(ctx, cfg)
			if err != nil {
				return out, fmt.Errorf("proof %s (history in %s): %w", name, cfg.Dir, err)
			}
			r := res.Report
			out.Scenarios = append(out.Scenarios, proofScenarioJSON{
				Fault: fault.ID(), Fencing: fencing, Runs: r.Injections, Grants: r.Grants, WritesAccepted: r.WritesAccepted,
				StaleAttempted: r.StaleAttempted, StaleRefused: r.StaleRefused, StaleAccepted: r.StaleAccepted,
				FenceRegressions: r.FenceRegressions, Overlaps: r.Overlaps, DuplicateEffects: r.DuplicateEffects,
				Linearizable: r.Linearizable, HazardSeen: r.HazardSeen,
			})
		}
	}
	return out, nil
}

// printProof prints the scenarios as JSON or as a table with the verdict.
// dir is where the histories are.
func printProof(g *globals, out proofJSON, verdict, dir string) error {
	if g.output == "json" {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw,
		"FAULT\tFENCING\tRUNS\tGRANTS\tWRITES\tSTALE SENT/REFUSED/ACCEPTED\tFENCE REGR.\tOVERLAPS\tDUP. EFFECTS\tLINEARIZABLE\tHAZARD")
	for _, s := range out.Scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d/%d/%d\t%d\t%d\t%d\t%v\t%v\n", s.Fault, onOff(s.Fencing), s.Runs, s.Grants, s.WritesAccepted,
			s.StaleAttempted, s.StaleRefused, s.StaleAccepted, s.FenceRegressions, s.Overlaps, s.DuplicateEffects, s.Linearizable,
			s.HazardSeen)
	}
	tw.Flush()
	fmt.Fprintf(g.stdout, "\n%s\nhistories: %s\n", verdict, dir)
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// proofVerdict says whether the scenarios keep the promise: with fencing,
// no stale write accepted, no duplicate effect, linearizable, no fence
// regression; without, the M1 hazard seen (else the checker is blind).
func proofVerdict(ss []proofScenarioJSON) (string, bool) {
	var bad []string
	sawM1Off := false
	for _, s := range ss {
		if s.Fencing && (s.StaleAccepted != 0 || s.DuplicateEffects != 0 || !s.Linearizable || s.FenceRegressions != 0) {
			bad = append(bad, fmt.Sprintf("%s with fencing on broke the promise", s.Fault))
		}
		if !s.Fencing && s.Fault == proof.PauseHolder.ID() {
			sawM1Off = true
			if !s.HazardSeen {
				bad = append(bad, "M1 with fencing off showed no hazard: the checker is not believed")
			}
		}
	}
	if !sawM1Off {
		bad = append(bad, "M1 with fencing off did not run")
	}
	if len(bad) > 0 {
		return "FAIL: " + strings.Join(bad, "; "), true
	}
	return "PASS: with fencing on no stale write was accepted and no invoice sent twice, and the ledger is linearizable; " +
		"with fencing off the checker saw the M1 hazard.", false
}

// checkProofPrefix refuses a store holding leases under the proof prefix:
// proof creates fresh keys for every run and releases them, so a held one
// belongs to someone else (or to a proof still running).
//
// It also warns on stderr when the store is a Redis that does not keep
// its data across a restart (proof does not restart the server, so a PASS
// says nothing about that), and refuses a store whose fence is weaker
// than strength, naming the --min-fence that accepts it.
func checkProofPrefix(ctx context.Context, g *globals, strength fenced.FenceStrength) error {
	c, err := fenced.Open(ctx, g.store, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if rd, ok := rootaccess.Driver(c).(*fencedredis.Driver); ok {
		if w := redisPersistenceWarning(ctx, rd.Client()); w != "" {
			fmt.Fprintf(g.stderr, "fenced: warning: %s\n", w)
		}
	}
	if _, err := c.Resolve(&fenced.LeaseOptions{MinFence: strength, TTL: time.Second}); err != nil {
		if errors.Is(err, fenced.ErrNoFence) {
			return noFenceError("proof", strength, c.Capabilities())
		}
		return withCode(exitUsage, err)
	}
	infos, err := c.List(ctx, proofPrefix)
	if errors.Is(err, fenced.ErrUnsupported) {
		return fmt.Errorf("proof: this store cannot list leases, so proof cannot check that %q holds none it did not create: %w",
			proofPrefix, err)
	}
	if err != nil {
		return err
	}
	for _, i := range infos {
		if i.Held {
			return withCode(exitUsage,
				fmt.Errorf("proof: lease %q is held under %q, and proof did not create it; refusing to run "+
					"(wait for it to end or break it)", i.Key, proofPrefix))
		}
	}
	return nil
}

// redisPersistenceWarning asks a Redis server whether it keeps its data
// across a restart (CONFIG GET appendonly, appendfsync, save) and returns
// a warning when it does not, or when it cannot tell; "" when the server
// has appendonly yes and appendfsync always. A Redis fence is a counter in
// the server's memory: a restart that loses it starts it over, and a fence
// already used can be handed out again.
func redisPersistenceWarning(ctx context.Context, rc goredis.UniversalClient) string {
	const repeat = "after a restart of the server its fences can repeat (the counter is lost with the data); " +
		"proof does not restart the server, so its verdict does not cover that. " +
		"Set appendonly yes and appendfsync always"
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conf, err := rc.ConfigGet(cctx, "*").Result()
	if err != nil {
		return fmt.Sprintf("cannot tell whether this Redis keeps its data across a restart (CONFIG GET refused: %v); "+
			"without appendonly yes and appendfsync always, %s", err, repeat)
	}
	aof, fsync, save := conf["appendonly"], conf["appendfsync"], conf["save"]
	switch {
	case aof != "yes" && save == "":
		return fmt.Sprintf("this Redis keeps no data across a restart (appendonly %s, no save points): %s", aof, repeat)
	case aof != "yes":
		return fmt.Sprintf("this Redis keeps only snapshots (appendonly %s, save %q): "+
			"a restart loses the grants since the last one, and %s", aof, save, repeat)
	case fsync != "always":
		return fmt.Sprintf("this Redis syncs its append-only file %q, not always: a crash can lose the last grants, and %s", fsync, repeat)
	}
	return ""
}
