package proof

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// skewRates are the clock rates of SkewClockRate's rows: worker 0's clock
// at a quarter of the real rate (a slow holder) and at four times it (a
// fast waiter). Four is past what a live holder's renewals cover: they
// change the grant's version every TTL/3, and a waiter whose TTL-long
// watch lasts less than that on the real clock can end it between two.
var skewRates = []float64{0.25, 4}

// runSkew runs SkewClockRate on dynalite at rate and checks it: with
// fencing, nothing stale accepted (the usual promise) although the held
// holder did send a stale write; without, the checker sees it accepted.
func runSkew(t *testing.T, store string, rate float64, fencing bool, injections int) Row {
	cfg := Config{Fault: SkewClockRate, ClockRate: rate, Fencing: fencing, MinFence: fenced.FenceStrict, TTL: time.Second, Injections: injections}
	var rep Report
	// A starved machine can leave the other worker no write while the
	// holder is held (the nemesis waits heldFor): such a run proves
	// nothing, and is run again, up to three times. Every run's safety
	// is checked.
	for try := 1; try <= 3; try++ {
		cfg.Keys = []string{fmt.Sprintf("fenced-proof:skew:%v:%v:%d", rate, fencing, time.Now().UnixNano())}
		rep = runScenario(t, store, cfg)
		checkScenario(t, "dynamodb", SkewClockRate, fencing, rep)
		if rep.StaleAttempted > 0 {
			break
		}
		t.Logf("rate %v fencing=%v, run %d: no second holder got in while the first was held; again", rate, fencing, try)
	}
	if rep.StaleAttempted == 0 {
		t.Errorf("rate %v fencing=%v: %+v; the skewed clock let no second holder in while the first was held: the row proves nothing", rate, fencing, rep)
	}
	if !fencing && rep.StaleAccepted == 0 {
		t.Errorf("rate %v fencing off: %+v; the stale write must be accepted without a fence", rate, rep)
	}
	return Row{Backend: fmt.Sprintf("dynamodb (worker 0's clock at %v×)", rate), Fault: SkewClockRate, Fencing: fencing, Ordering: ClaimFirst, Report: &rep}
}

// TestClockRateSkewDynamoDB runs SkewClockRate on a real dynalite with
// real worker processes: the slow holder with fencing on and off, one
// injection each. With FENCED_PROOF_OUT set (scripts/proof.sh) it runs
// both rates, fencing on and off, two injections each, and rewrites the
// report's clock-rate section.
func TestClockRateSkewDynamoDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dynalite and worker processes")
	}
	parallelRow(t)
	out := os.Getenv("FENCED_PROOF_OUT")
	rates, injections := skewRates[:1], 1
	if out != "" {
		rates, injections = skewRates, 2
	}
	d := testenv.StartDynalite(t, testenv.DynaliteConfig{})
	store := d.URL("fenced_proof", "create=1")
	var rows []Row
	for _, rate := range rates {
		for _, fencing := range []bool{true, false} {
			t.Run(fmt.Sprintf("rate=%v/fencing=%v", rate, fencing), func(t *testing.T) {
				rows = append(rows, runSkew(t, store, rate, fencing, injections))
			})
		}
	}
	if out != "" && !t.Failed() {
		var sec bytes.Buffer
		sec.WriteString(skewBegin + "\n## Clock rate skew on observed expiry (DynamoDB)\n\n")
		fmt.Fprintf(&sec, "Run %s with `FENCED_PROOF_OUT=docs go test -run '^TestClockRateSkewDynamoDB$' ./internal/cli/proof/` (scripts/proof.sh), %d injections per row.\n\n", time.Now().UTC().Format("2006-01-02"), injections)
		sec.WriteString(skewPreamble)
		WriteMarkdownTable(&sec, rows)
		sec.WriteString(skewEnd + "\n")
		if err := updateSection(filepath.Join(out, "proof.md"), skewBegin, skewEnd, "## Timelines", sec.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	skewBegin = "<!-- clock-rate: begin -->"
	skewEnd   = "<!-- clock-rate: end -->"
)

var skewPreamble = strings.ReplaceAll(`M14 (SkewClockRate): DynamoDB has no server clock, so a waiter takes a grant
over once it has seen it unchanged for a TTL on its own monotonic clock
(docs/no-server-clock.md); clock steps change nothing, but a clock that runs
at the wrong rate does. One worker process (worker 0) runs on a clock at
0.25× or 4× the real rate, injected as the client's and the driver's clock
(fenced.Options.Clock, fenceddynamodb.Options.Clock), against a real
dynalite. The worker to be held must win the key first: a worker that
releases asks again at once and nearly always wins it back, so the others
start no new round until it has the key, and are let go once it is held.
0.25×: worker 0 is held before its write; its renewals come 4×
late, the others take the key over after a real TTL while worker 0 still
trusts its lease for 4. 4×: another worker is held, renewing every TTL/3;
worker 0's TTL-long watch lasts a quarter of a real TTL, ends between two
renewals and takes the key over. In both the held holder then writes with
its old fence: the fence refuses it; without fencing it is accepted.
Grants and writes accepted are the rows' operation counts. With both
clocks at the real rate (1.001×) no one takes the held holder's key in 8
TTLs: no stale write is attempted, and the test fails as proving nothing.

`, "\r", "")
