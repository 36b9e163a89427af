package main

import (
	"bytes"
	"testing"
	"time"
)

// TestLineStamperStampsWholeLines: each line gets the time it was
// completed, a partial line waits for its end, and nothing is lost.
func TestLineStamperStampsWholeLines(t *testing.T) {
	var out bytes.Buffer
	s := newLineStamper(&out)
	at := time.Date(2026, 12, 5, 20, 1, 2, 345e6, time.FixedZone("CET", 3600))
	s.now = func() time.Time { return at }
	for _, w := range []string{"fenced: a\nfenced: b", "c\n", "", "fenced: d\n\n"} {
		if n, err := s.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", w, n, err)
		}
	}
	want := "2026-12-05T19:01:02.345Z fenced: a\n2026-12-05T19:01:02.345Z fenced: bc\n" +
		"2026-12-05T19:01:02.345Z fenced: d\n2026-12-05T19:01:02.345Z \n"
	if out.String() != want {
		t.Errorf("stamped:\n%s\nwant:\n%s", out.String(), want)
	}
}
