package proof

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The supervisors' section names each row's build, seed and counts, and
// the first failing scenario with its line (a "|" in it cannot break the
// table).
func TestWriteGenSupSection(t *testing.T) {
	rows := []GenSupRow{
		{Build: "main", Report: GenSupReport{Seed: 7, Duration: 70 * time.Second, ByCommand: map[string]int{"run": 1, "elect": 2, "partitions": 3},
			ByAttack: map[string]int{"loss": 6}, ByMode: map[string]int{"cgroup": 4, "proctree": 2}, Attempts: 100, Late: 5, Excused: 5}},
		{Build: "item 2 disabled", Report: GenSupReport{Seed: 7, ByCommand: map[string]int{"run": 1}, Failed: 1, FirstFailure: "00-run-loss/cgroup",
			FirstViolation: 3 * time.Second, FailureLine: "late a|b"}},
	}
	var b bytes.Buffer
	WriteGenSupSection(&b, rows)
	s := b.String()
	for _, want := range []string{genSupBegin, genSupEnd, "| main | 7 | 70 | 1 / 2 / 3 | 4 / 2 | loss 6 | 100 | 5 (5) | 0 | none |",
		"| item 2 disabled | 7 | 0 | 1 / 0 / 0 | 0 / 0 |  | 0 | 0 (0) | 1 | 3s in (00-run-loss/cgroup): late a/b |"} {
		if !strings.Contains(s, want) {
			t.Errorf("the section lacks %q:\n%s", want, s)
		}
	}
	if got := rows[0].Report.Scenarios(); got != 6 {
		t.Errorf("Scenarios() = %d, want 6", got)
	}
}
