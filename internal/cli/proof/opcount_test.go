package proof

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOpCounterCountsAsCheckGen counts, in a history written in two parts
// (the first ending mid-line), the operations as CheckGen does: one per
// operation whatever the number of its keys, Breaks included, nothing
// else.
func TestOpCounterCountsAsCheckGen(t *testing.T) {
	path := filepath.Join(t.TempDir(), historyFile)
	rec, err := OpenRecorder(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	events := []Event{
		{Kind: AcquireInvoke, Op: 1, Name: "all", Key: "a"},
		{Kind: AcquireInvoke, Op: 1, Name: "all", Key: "b"},
		{Kind: AcquireOK, Op: 1, Key: "a", Fence: 1},
		{Kind: BreakInvoke, Op: 2, Name: "break", Key: "a"},
		{Kind: AcquireInvoke, Op: 3, Name: "try", Key: "c"},
	}
	for _, e := range events[:4] {
		if err := rec.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(`{"t":1,"w":0,"k":"acquire","n":"try","key":"d","op":`); err != nil {
		t.Fatal(err)
	}
	c := opCounter{path: path}
	if n, err := c.count(); err != nil || n != 2 {
		t.Fatalf("count = %d, %v; want 2 (ops 1 and 2; a line being written waits)", n, err)
	}
	if _, err := f.WriteString("4}\n"); err != nil {
		t.Fatal(err)
	}
	if err := rec.Record(events[4]); err != nil {
		t.Fatal(err)
	}
	all, err := ReadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	want := CheckGen(all, 0, 0, 0).Ops
	if n, err := c.count(); err != nil || n != want || n != 4 {
		t.Fatalf("count = %d, %v; CheckGen counts %d, want 4", n, err, want)
	}
}
