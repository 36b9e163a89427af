package electproof

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedk8s"
	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	proof.RegisterElector(runOrDie)
	proof.MaybeRunWorker()
	os.Exit(m.Run())
}

// runOrDie is the row's elector: client-go's leaderelection.RunOrDie over
// a fencedk8s.ResourceLock, as users run it, again and again. A leader
// works under lock.LeaderContext of client-go's context.
func runOrDie(c *fenced.Client, id string, cfg proof.GenElectMemberConfig, lead func(elector, work context.Context, l *fenced.Lease)) error {
	lock, err := fencedk8s.New(c, cfg.Election, id, &fencedk8s.Options{
		Lease:         fenced.LeaseOptions{MinFence: cfg.MinFence},
		RenewDeadline: cfg.RenewDeadline,
		RetryPeriod:   cfg.RetryPeriod,
	})
	if err != nil {
		return err
	}
	for {
		leaderelection.RunOrDie(context.Background(), leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   cfg.LeaseDuration,
			RenewDeadline:   cfg.RenewDeadline,
			RetryPeriod:     cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(cg context.Context) {
					lc, l := lock.LeaderContext(cg)
					lead(cg, lc, l)
				},
				OnStoppedLeading: func() {},
			},
		})
	}
}

// testCommand re-executes the test binary as an elector.
func testCommand() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") }

// backend is a store of the row: its name, the weakest fence the
// election's lease accepts, and start, which starts it for t and returns
// its URL.
type backend struct {
	name     string
	minFence fenced.FenceStrength
	start    func(t *testing.T) string
}

// backends are the backends of the elector row: Redis (each elector
// behind its own proxy, so links can be cut) and SQLite (no link to cut),
// as internal/cli/proof's own rows start them.
var backends = []backend{
	{"redis", fenced.FenceRepeatable, func(t *testing.T) string { return testenv.StartRedis(t, testenv.RedisConfig{}).URL() }},
	{"sqlite", fenced.FenceStrict, func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "leases.db") }},
}

// genSeed returns FENCED_PROOF_SEED, or a seed drawn from the clock.
func genSeed(t *testing.T) uint64 {
	if s := os.Getenv("FENCED_PROOF_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FENCED_PROOF_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// envDuration returns the duration in env var name, or def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	if s := os.Getenv(name); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, s, err)
		}
		return d
	}
	return def
}

// TestGenerativeElector is the elector row of the generative proof
// (proof.RunGenElect, proof.CheckGenElect): 3 processes running client-go's
// leaderelection.RunOrDie over fencedk8s under cut links, SIGSTOP past
// the LeaseDuration, kill -9 and Client.Break, for 30s
// (FENCED_PROOF_ELECT_DURATION) per backend, with the schedule drawn from
// FENCED_PROOF_SEED (printed on failure). FENCED_PROOF_ELECT_HAZARD=1
// makes the leaders work under client-go's context alone (the hazard the
// checker must find).
func TestGenerativeElector(t *testing.T) {
	if testing.Short() {
		t.Skip("the generative proof starts servers and elector processes")
	}
	seed := genSeed(t)
	d := envDuration(t, "FENCED_PROOF_ELECT_DURATION", 30*time.Second)
	hazard := os.Getenv("FENCED_PROOF_ELECT_HAZARD") != ""
	only := os.Getenv("FENCED_PROOF_BACKENDS")
	for _, b := range backends {
		if only != "" && !slices.Contains(strings.Split(only, ","), b.name) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			runGenElect(t, b, proof.GenElectConfig{Seed: seed, Duration: d, IgnoreLeaderContext: hazard})
		})
	}
}

// runGenElect runs one elector run on backend b and fails t, naming the
// seed, if the checker finds a violation.
func runGenElect(t *testing.T, b backend, cfg proof.GenElectConfig) proof.GenElectReport {
	t.Helper()
	cfg.Store, cfg.MinFence = b.start(t), b.minFence
	cfg.Command, cfg.Logf = testCommand, t.Logf
	cfg.Dir = t.TempDir()
	if keep := os.Getenv("PROOF_KEEP"); keep != "" {
		cfg.Dir = filepath.Join(keep, fmt.Sprintf("genelect-%s-%d", b.name, cfg.Seed))
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+3*time.Minute)
	defer cancel()
	rep, err := proof.RunGenElect(ctx, cfg)
	if err != nil {
		t.Fatalf("%s seed %d: %v (history in %s)", b.name, cfg.Seed, err, cfg.Dir)
	}
	t.Logf("%s seed %d (%v, hazard switch %t): faults %v (on the leader %v), %d terms (%d without a lease), writes %d accepted / %d refused; overlaps %d (after a break %d, max %v), client-go overlaps %d strict / %d after a stop or break (max %v, max %v after the resume), stale accepted %d; longest recovery %v after a %s (bound %v, scheduling delay %v, %d recoveries)",
		b.name, rep.Seed, rep.Duration, cfg.IgnoreLeaderContext, rep.Faults, rep.Hurt, rep.Terms, rep.NoLease, rep.WritesAccepted, rep.WritesRefused,
		rep.Overlaps, rep.BreakOverlaps, rep.MaxBreakOverlap.Round(time.Millisecond), rep.CGOverlaps, rep.CGPauseOverlaps, rep.MaxCGPauseOverlap.Round(time.Millisecond), rep.MaxCGAfterResume.Round(time.Millisecond),
		rep.StaleAccepted, rep.LongestRecovery.Round(time.Millisecond), rep.RecoveryKind, rep.Bound.Round(time.Millisecond), rep.MaxSchedDelay.Round(time.Millisecond), rep.Recoveries)
	if rep.Failed() {
		t.Errorf("%s: the elector proof failed with seed %d (rerun: FENCED_PROOF_SEED=%d), first violation %v into the run; history in %s:\n%s",
			b.name, rep.Seed, rep.Seed, rep.FirstViolation.Round(time.Millisecond), cfg.Dir, strings.Join(rep.Problems, "\n"))
	}
	if out := os.Getenv("FENCED_PROOF_OUT"); out != "" {
		build := os.Getenv("FENCED_PROOF_BUILD")
		switch {
		case build != "":
		case cfg.IgnoreLeaderContext:
			build = "hazard: leaders under client-go's context alone"
		default:
			build = "main"
		}
		rows := filepath.Join(out, "proof", "generative-elector.json")
		row := proof.GenElectRow{Build: build, Backend: b.name, Report: rep, Date: time.Now().UTC().Format("2006-01-02")}
		if err := proof.SaveGenElectRow(rows, row); err != nil {
			t.Error(err)
		} else if err := proof.UpdateGenElectSection(filepath.Join(out, "proof.md"), rows); err != nil {
			t.Error(err)
		}
	}
	// What the row must have exercised for its zeros to mean something:
	// faults on the leader, several terms, and writes under them.
	if rep.Recoveries < 3 || rep.Terms < 3 || rep.WritesAccepted < proof.GenElectMinWrites {
		t.Errorf("%s seed %d: too little happened (faults %v, on the leader %v, %d terms, %d writes)", b.name, rep.Seed, rep.Faults, rep.Hurt, rep.Terms, rep.WritesAccepted)
	}
	return rep
}
