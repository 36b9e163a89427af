package main

import (
	"bytes"
	"regexp"
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

// TestPartitionsRunStampsItsLastLine: the error partitions run (and its
// supervise processes) exit with is stamped like its other lines. Before,
// a supervisor's "was lost before …" line came without its time.
func TestPartitionsRunStampsItsLastLine(t *testing.T) {
	var out, errb bytes.Buffer
	code := execute([]string{"--store", "sqlite:///proc/nope/leases.db", "partitions", "run", "g", "-p", "2", "--", "true"}, &out, &errb)
	stamped := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z fenced: open .*\(exit 64\)\n$`)
	if code != exitUsage || !stamped.MatchString(errb.String()) {
		t.Errorf("exit %d, stderr %q; want 64 and one line that starts with its time", code, errb.String())
	}
}
