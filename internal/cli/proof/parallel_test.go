package proof

import (
	"os"
	"testing"
)

// parallelRow lets a long row of the proof run beside the others (the
// package's tests took 13 minutes one after another), unless the rows
// write their results into FENCED_PROOF_OUT, a file they share.
func parallelRow(t *testing.T) {
	if os.Getenv("FENCED_PROOF_OUT") == "" {
		t.Parallel()
	}
}
