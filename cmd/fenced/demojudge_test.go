package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestJudgeScenario checks the demo's verdicts from the invoices sent: one
// by a newer holder is OK; the frozen worker's as well (two) is broken
// with the guard and the hazard without it; a run where no holder after
// the frozen one sent demonstrated nothing (and runs again), whatever the
// frozen worker's write met.
func TestJudgeScenario(t *testing.T) {
	type send struct {
		worker string
		fence  int
	}
	for _, c := range []struct {
		name    string
		noFence bool
		sends   []send
		want    string // "OK", "HAZARD", "BROKEN" or "nothing"
	}{
		{"newer sent, frozen refused", false, []send{{"worker-1", 4}}, "OK"},
		{"both sent with the guard", false, []send{{"worker-1", 4}, {"worker-2", 3}}, "BROKEN"},
		{"only the frozen sent", false, []send{{"worker-2", 3}}, "nothing"},
		{"nobody sent", false, nil, "nothing"},
		{"an older holder sent", false, []send{{"worker-3", 2}}, "nothing"},
		{"both sent without the guard", true, []send{{"worker-1", 4}, {"worker-2", 3}}, "HAZARD"},
		{"only the frozen sent without the guard", true, []send{{"worker-2", 3}}, "nothing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "billing.db")
			if err := setupBilling(ctx, path); err != nil {
				t.Fatal(err)
			}
			db, err := openBilling(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range c.sends {
				if _, err := db.ExecContext(ctx, `INSERT INTO sent_invoices (invoice, worker, fence) VALUES (?, ?, ?)`,
					demoInvoice, s.worker, s.fence); err != nil {
					t.Fatal(err)
				}
			}
			db.Close()
			out, err := judgeScenario(ctx, path, c.noFence, "worker-2", 3)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			switch {
			case errors.Is(out.Err, errNothingDemonstrated):
				got = "nothing"
			case out.Err != nil && strings.Contains(out.Err.Error(), "INVARIANT BROKEN"):
				got = "BROKEN"
			case strings.HasPrefix(out.Verdict, "OK"):
				got = "OK"
			case strings.HasPrefix(out.Verdict, "HAZARD"):
				got = "HAZARD"
			default:
				got = fmt.Sprintf("verdict %q, error %v", out.Verdict, out.Err)
			}
			if got != c.want {
				t.Fatalf("sends %v: %s, want %s", c.sends, got, c.want)
			}
		})
	}
}
