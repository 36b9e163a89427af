package main

import (
	"slices"
	"time"
)

// Row is one figure of the report, as written to bench/results/*.json.
// Latencies are in microseconds; fields that do not apply to a workload
// are omitted.
type Row struct {
	Workload       string         `json:"workload"`
	Backend        string         `json:"backend"`
	Implementation string         `json:"implementation"`
	Params         map[string]any `json:"params"`
	P50us          float64        `json:"p50_us,omitempty"`
	P99us          float64        `json:"p99_us,omitempty"`
	OpsPerSec      float64        `json:"ops_per_sec,omitempty"`
	// RequestsPerOp is server-side requests per operation (per
	// acquire+release, per handover, per throughput op), or, for renewal,
	// per held lease per renewal period.
	RequestsPerOp float64 `json:"requests_per_op"`
	Samples       int     `json:"samples,omitempty"`

	// Renewal only.
	ServerCallsPerPeriod float64 `json:"server_calls_per_period,omitempty"`
	CPUSecondsPerSecond  float64 `json:"cpu_seconds_per_second,omitempty"`
	HeapBytesPerLease    float64 `json:"heap_bytes_per_lease,omitempty"`
	Goroutines           int     `json:"goroutines,omitempty"`
	LeasesLost           *int    `json:"leases_lost,omitempty"`
	LossCause            string  `json:"loss_cause,omitempty"` // why one lease was lost
	AcquireAllSeconds    float64 `json:"acquire_all_seconds,omitempty"`

	// Error says why a figure is missing (the run went on without it).
	Error string `json:"error,omitempty"`
}

// Results is one run of the suite.
type Results struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Command string `json:"command"`
	Quick   bool   `json:"quick"`
	// Seconds is how long the run took.
	Seconds float64  `json:"seconds"`
	Notes   []string `json:"notes,omitempty"`
	Rows    []Row    `json:"rows"`
}

// percentile returns the q-quantile (0..1) of lat in microseconds; lat is
// sorted in place.
func percentile(lat []time.Duration, q float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	i := int(q * float64(len(lat)-1))
	return float64(lat[i].Nanoseconds()) / 1e3
}
