package zookeeper

import (
	"strings"
	"testing"
)

// TestOrderAfterSequenceWrap checks the ordering of lock nodes whose
// sequence suffixes wrapped (issue 9 item 9): the holder is the oldest
// node by czxid and a waiter waits for the youngest of its elders, whatever
// the suffixes say, while the suffixes stay a mere hint.
func TestOrderAfterSequenceWrap(t *testing.T) {
	const lockPath = "/fenced/k"
	// Created in this order (czxid): the holder got the last suffix before
	// the counter overflowed; the next creations in flight together got
	// negative suffixes; later ones repeat 2147483647 (ZooKeeper 3.5+ stops
	// the counter there).
	nodes := map[string]int64{
		"_c_hold-lock-2147483647":  100,
		"_c_neg1-lock--2147483648": 101,
		"_c_neg2-lock--2147483647": 102,
		"_c_late-lock-2147483647":  103,
	}
	var names []string
	for n := range nodes {
		names = append(names, n)
	}
	children, err := parseChildren(lockPath, names)
	if err != nil {
		t.Fatal(err)
	}
	var hint []string
	for i := range children {
		hint = append(hint, children[i].name)
		children[i].czxid = nodes[children[i].name]
	}
	// The hint reads negative suffixes as the unsigned counter: after the
	// positive ones. Ties are broken by name.
	if want := "_c_hold-lock-2147483647 _c_late-lock-2147483647 _c_neg1-lock--2147483648 _c_neg2-lock--2147483647"; strings.Join(hint, " ") != want {
		t.Errorf("hint order %v, want %s", hint, want)
	}
	if h := children[oldest(children)].name; h != "_c_hold-lock-2147483647" {
		t.Errorf("holder %s, want _c_hold-lock-2147483647 (lowest czxid)", h)
	}
	// Ordered by suffix (numerically, as fenced did, or as strings, as
	// Curator does) a negative suffix comes first: a second holder.
	bySuffix := children[0]
	for _, c := range children {
		if c.seq < bySuffix.seq {
			bySuffix = c
		}
	}
	if bySuffix.name != "_c_neg1-lock--2147483648" || bySuffix.seq != -2147483648 {
		t.Errorf("lowest suffix %s (%d), want _c_neg1-lock--2147483648", bySuffix.name, bySuffix.seq)
	}
	// _c_late waits for the youngest of its elders: _c_neg2.
	var elders []child
	for _, c := range children {
		if c.czxid < nodes["_c_late-lock-2147483647"] {
			elders = append(elders, c)
		}
	}
	if p := elders[newest(elders)].name; p != "_c_neg2-lock--2147483647" {
		t.Errorf("_c_late's predecessor %s, want _c_neg2-lock--2147483647", p)
	}
	if oldest(nil) != -1 || newest(nil) != -1 {
		t.Error("oldest/newest of no nodes must be -1")
	}
}

// TestParseChildrenRefusesForeignNodes checks that names that are not lock
// nodes are refused with the node and path named.
func TestParseChildrenRefusesForeignNodes(t *testing.T) {
	for _, n := range []string{"config", "_c_x-lock-", "_c_x-lock-abc", "_c_x-lock-99999999999"} {
		_, err := parseChildren("/fenced/k", []string{"_c_ok-lock-0000000001", n})
		if err == nil || !strings.Contains(err.Error(), "foreign node") || !strings.Contains(err.Error(), n) || !strings.Contains(err.Error(), "/fenced/k") {
			t.Errorf("parseChildren with %q: %v, want a foreign-node error naming it and the path", n, err)
		}
	}
}
