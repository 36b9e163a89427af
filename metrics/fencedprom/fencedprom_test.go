package fencedprom_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
	"github.com/fenced-dev/fenced/metrics/fencedprom"
	"github.com/fenced-dev/fenced/metrics/internal/scenario"
)

// Every series and value after an acquire, a refused acquire, a wait that
// ran out, a renewal, a break, a stale write refused by a guard, an expiry
// and a client closed while holding.
func TestSeriesAfterScenario(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := fencedprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	scenario.Run(t, m.Hook, func() {
		want := fmt.Sprintf(`
# HELP fenced_leases_held Leases held now.
# TYPE fenced_leases_held gauge
fenced_leases_held{key_group="invoice",store="sqlite"} 1
# HELP fenced_lease_validity_remaining_seconds The least local validity left among the leases held now: how close the next loss is if renewals stop. Absent when none is held.
# TYPE fenced_lease_validity_remaining_seconds gauge
fenced_lease_validity_remaining_seconds{key_group="invoice",store="sqlite"} %v
`, scenario.Validity.Seconds())
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metrics.LeasesHeld, metrics.ValidityRemaining); err != nil {
			t.Fatal(err)
		}
	})

	want := `
# HELP fenced_acquire_attempts_total Acquisitions by outcome: acquired, failed_open, held (refused at once), timeout (the wait ran out), canceled, error.
# TYPE fenced_acquire_attempts_total counter
fenced_acquire_attempts_total{key_group="invoice",result="acquired",store="sqlite"} 2
fenced_acquire_attempts_total{key_group="invoice",result="canceled",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="invoice",result="error",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="invoice",result="failed_open",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="invoice",result="held",store="sqlite"} 1
fenced_acquire_attempts_total{key_group="invoice",result="timeout",store="sqlite"} 1
fenced_acquire_attempts_total{key_group="report",result="acquired",store="sqlite"} 2
fenced_acquire_attempts_total{key_group="report",result="canceled",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="report",result="error",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="report",result="failed_open",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="report",result="held",store="sqlite"} 0
fenced_acquire_attempts_total{key_group="report",result="timeout",store="sqlite"} 0
# HELP fenced_leases_held Leases held now.
# TYPE fenced_leases_held gauge
fenced_leases_held{key_group="invoice",store="sqlite"} 0
fenced_leases_held{key_group="report",store="sqlite"} 0
# HELP fenced_leases_lost_total Leases that ended without their holder releasing them, by reason: refused, expired, broken, closed.
# TYPE fenced_leases_lost_total counter
fenced_leases_lost_total{key_group="invoice",reason="broken",store="sqlite"} 1
fenced_leases_lost_total{key_group="invoice",reason="closed",store="sqlite"} 0
fenced_leases_lost_total{key_group="invoice",reason="expired",store="sqlite"} 0
fenced_leases_lost_total{key_group="invoice",reason="refused",store="sqlite"} 0
fenced_leases_lost_total{key_group="report",reason="broken",store="sqlite"} 0
fenced_leases_lost_total{key_group="report",reason="closed",store="sqlite"} 1
fenced_leases_lost_total{key_group="report",reason="expired",store="sqlite"} 1
fenced_leases_lost_total{key_group="report",reason="refused",store="sqlite"} 0
# HELP fenced_owner_changes_total Grants that took a key over from another holder (the key was found held, then granted): hand-overs, the key's churn.
# TYPE fenced_owner_changes_total counter
fenced_owner_changes_total{key_group="invoice",store="sqlite"} 1
fenced_owner_changes_total{key_group="report",store="sqlite"} 0
# HELP fenced_renewals_total Renewals by outcome: ok, refused (the authority no longer had the grant), error (retried until local validity ran out).
# TYPE fenced_renewals_total counter
fenced_renewals_total{key_group="invoice",result="error",store="sqlite"} 0
fenced_renewals_total{key_group="invoice",result="ok",store="sqlite"} 1
fenced_renewals_total{key_group="invoice",result="refused",store="sqlite"} 1
fenced_renewals_total{key_group="report",result="error",store="sqlite"} 0
fenced_renewals_total{key_group="report",result="ok",store="sqlite"} 0
fenced_renewals_total{key_group="report",result="refused",store="sqlite"} 0
# HELP fenced_stale_writes_refused_total Writes refused by a fence guard because a newer holder had written: each one is a paused or partitioned holder caught.
# TYPE fenced_stale_writes_refused_total counter
fenced_stale_writes_refused_total{key_group="invoice",store="sqlite"} 1
fenced_stale_writes_refused_total{key_group="report",store="sqlite"} 0
`
	names := []string{metrics.AcquireAttempts, metrics.LeasesHeld, metrics.LeasesLost, metrics.OwnerChanges, metrics.Renewals, metrics.StaleWrites, metrics.ValidityRemaining}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}

	// Histograms: one wait per grant, one hold and one ratio per ended
	// lease; report:daily was held exactly its TTL on its fake clock.
	for _, name := range []string{metrics.AcquireWait, metrics.LeaseHold, metrics.LeaseHoldTTLRatio} {
		for group, n := range map[string]uint64{"invoice": 2, "report": 2} {
			if h := histogram(t, reg, name, group); h.GetSampleCount() != n {
				t.Errorf("%s{key_group=%q}: %d samples, want %d", name, group, h.GetSampleCount(), n)
			}
		}
	}
	if h := histogram(t, reg, metrics.LeaseHoldTTLRatio, "report"); bucket(h, 0.75) != 1 || bucket(h, 1.5) != 2 {
		t.Errorf("report hold/TTL ratios: %v; want the expired lease (≈1) in (0.75, 1.5] and the closed one below", h.GetBucket())
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func histogram(t *testing.T, g prometheus.Gatherer, name, group string) *dto.Histogram {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == metrics.LabelKeyGroup && lp.GetValue() == group {
					return m.GetHistogram()
				}
			}
		}
	}
	t.Fatalf("no %s{key_group=%q}", name, group)
	return nil
}

// bucket returns the cumulative count of h's bucket with upper bound le.
func bucket(h *dto.Histogram, le float64) uint64 {
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	return 0
}

// Key groups are bounded: past MaxKeyGroups, new groups become "_other".
func TestKeyGroupsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := fencedprom.New(reg, &fencedprom.Options{Groups: metrics.Options{MaxKeyGroups: 2}})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Hook("mem")
	for _, k := range []string{"a:1", "b:1", "c:1", "d", "a:2"} {
		h(fenced.Event{Kind: fenced.EventStaleWrite, Key: k, Fence: 1, Current: 2})
	}
	want := `
# HELP fenced_stale_writes_refused_total Writes refused by a fence guard because a newer holder had written: each one is a paused or partitioned holder caught.
# TYPE fenced_stale_writes_refused_total counter
fenced_stale_writes_refused_total{key_group="_other",store="mem"} 2
fenced_stale_writes_refused_total{key_group="a",store="mem"} 2
fenced_stale_writes_refused_total{key_group="b",store="mem"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metrics.StaleWrites); err != nil {
		t.Fatal(err)
	}
	if _, err := fencedprom.New(reg, nil); err == nil {
		t.Fatal("registering fenced's series twice succeeded")
	}
}
