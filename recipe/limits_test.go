package recipe

import (
	"testing"

	"github.com/fenced-dev/fenced/internal/core/limits"
)

// TestLimitsAgree ties the recipes' limits to the copies the CLI and
// httpapi check input against: the recipes import nothing internal.
func TestLimitsAgree(t *testing.T) {
	if maxPartitions != limits.MaxPartitions || maxPermits != limits.MaxPermits {
		t.Fatalf("recipe allows %d partitions and %d permits; internal/core/limits says %d and %d",
			maxPartitions, maxPermits, limits.MaxPartitions, limits.MaxPermits)
	}
}
