package fencedprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/metrics"
	"github.com/fenced-dev/fenced/metrics/fencedprom"
	"github.com/fenced-dev/fenced/metrics/internal/scenario"
	"github.com/fenced-dev/fenced/recipe"
)

// TestPartitionsCollector: a lone member of 8 partitions owns all 8, and
// the collector says so with its group label; after a second member
// joins, the first has handed off 4 and counts them.
func TestPartitionsCollector(t *testing.T) {
	ctx := context.Background()
	open := func() *fenced.Client {
		c, err := fenced.Open(ctx, "mem://"+t.Name(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	a, err := recipe.JoinPartitions(ctx, open(), "billing", 8, idle, &recipe.PartitionsOptions{MemberID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Leave(ctx)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(fencedprom.NewPartitionsCollector("billing", a))
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.GetMetric()[0]
				if l := m.GetLabel(); len(l) != 1 || l[0].GetValue() != "billing" {
					t.Errorf("%s labels %v, want group=billing", name, l)
				}
				if m.Gauge != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
		t.Fatalf("no series %s", name)
		return 0
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 5s: %s", what)
			}
		}
	}
	waitFor("a owns 8", func() bool { return gauge("fenced_partitions_owned") == 8 })
	b, err := recipe.JoinPartitions(ctx, open(), "billing", 8, idle, &recipe.PartitionsOptions{MemberID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Leave(ctx)
	waitFor("a owns 4 after b joined", func() bool { return gauge("fenced_partitions_owned") == 4 })
	if got := gauge("fenced_partitions_handoffs_total"); got != 4 {
		t.Errorf("handoffs_total %v, want 4", got)
	}
	if got := gauge("fenced_partitions_members"); got != 2 {
		t.Errorf("members %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != len(metrics.PartitionsNames) {
		t.Errorf("%d series (%v), want %d", n, err, len(metrics.PartitionsNames))
	}
}

// TestGroupSeries: a real group of 16 partitions on the embedded SQLite
// store and on mem, with members joining, one leaving and another
// joining (scenario.Group checks the series against the recipe), and the
// same label values at 64 partitions: the group's series are bounded
// whatever P and the member IDs.
func TestGroupSeries(t *testing.T) { scenario.GroupsBounded(t, promExporter()) }

// promExporter returns a new registry with fenced's Metrics for each
// member, as each member process would have.
func promExporter() func(testing.TB) scenario.Exporter {
	return func(t testing.TB) scenario.Exporter {
		reg := prometheus.NewPedanticRegistry()
		m, err := fencedprom.New(reg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return scenario.Exporter{Hook: m.Hook, Gatherer: reg, Attach: func(group string, p *recipe.Partitions) {
			reg.MustRegister(fencedprom.NewPartitionsCollector(group, p))
		}}
	}
}
