package fencedprom_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/metrics/fencedprom"
)

func Example() {
	ctx := context.Background()
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer, served by promhttp
	m, err := fencedprom.New(reg, nil)
	if err != nil {
		panic(err)
	}
	client, err := fenced.Open(ctx, "mem://example", &fenced.Options{Hook: m.Hook("mem")})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	lease, err := client.TryAcquire(ctx, "invoice:inv_72", nil)
	if err != nil {
		panic(err)
	}
	if _, err := client.TryAcquire(ctx, "invoice:inv_72", nil); err != nil {
		fmt.Println("second try refused: the key is held")
	}
	lease.Release(ctx)

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP fenced_leases_held Leases held now.
# TYPE fenced_leases_held gauge
fenced_leases_held{key_group="invoice",store="mem"} 0
`), "fenced_leases_held")
	fmt.Println("leases held after release:", err == nil)
	n, _ := testutil.GatherAndCount(reg, "fenced_acquire_attempts_total")
	fmt.Println("acquire series:", n)
	// Output:
	// second try refused: the key is held
	// leases held after release: true
	// acquire series: 6
}
