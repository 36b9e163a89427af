package payprovider_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/payprovider"
)

// TestReplayKeepsStatus: a repeated idempotency key gets the first answer
// again with its status, as real providers do. A replayed rejection used to
// come back as 200 with the error body, which a client read as a payment
// with an empty reference.
func TestReplayKeepsStatus(t *testing.T) {
	ctx := context.Background()
	p := payprovider.Start()
	defer p.Close()
	c := &payprovider.Client{URL: p.URL()}

	for i := range 2 {
		if _, err := c.Pay(ctx, "k-rejected", "po_1", -5); !errors.Is(err, payprovider.ErrRejected) || !strings.Contains(err.Error(), "not positive") {
			t.Fatalf("attempt %d of a rejected payment: %v, want ErrRejected with the reason", i+1, err)
		}
	}
	if _, err := c.Lookup(ctx, "k-rejected"); !errors.Is(err, payprovider.ErrRejected) {
		t.Fatalf("lookup of a rejected key: %v, want ErrRejected", err)
	}
	for i := range 2 {
		ref, err := c.Pay(ctx, "k-paid", "po_2", 500)
		if err != nil || ref != "pay_1" {
			t.Fatalf("attempt %d of a payment: %q %v, want pay_1", i+1, ref, err)
		}
	}
	if n := len(p.Payouts()); n != 1 {
		t.Fatalf("%d payouts, want 1", n)
	}

	// The raw statuses: 201 first, 200 on a replay; 422 both times.
	for _, tc := range []struct {
		key, amount string
		want        []int
	}{
		{"k-raw-paid", "7", []int{http.StatusCreated, http.StatusOK}},
		{"k-raw-rejected", "0", []int{http.StatusUnprocessableEntity, http.StatusUnprocessableEntity}},
	} {
		for i, want := range tc.want {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL()+"/payouts", strings.NewReader(`{"payout_id":"x","amount_cents":`+tc.amount+`}`))
			req.Header.Set("Idempotency-Key", tc.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			replayed := resp.Header.Get("Idempotent-Replayed") == "true"
			if resp.StatusCode != want || replayed != (i > 0) {
				t.Fatalf("%s request %d: HTTP %d replayed=%v, want %d replayed=%v", tc.key, i+1, resp.StatusCode, replayed, want, i > 0)
			}
		}
	}
}
