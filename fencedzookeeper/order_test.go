package fencedzookeeper

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
	d := newDriver("/fenced")
	defer d.Close()
	for n, czxid := range nodes {
		d.nodes.add(lockPath+"/"+n, czxid)
	}
	l := lineOf(t, d, lockPath, names, "_c_late-lock-2147483647", nodes["_c_late-lock-2147483647"])
	if p := l.predecessor().name; p != "_c_neg2-lock--2147483647" {
		t.Errorf("_c_late's predecessor %s, want _c_neg2-lock--2147483647", p)
	}
	if oldest(nil) != -1 {
		t.Error("oldest of no nodes must be -1")
	}
}

// lineOf is the line of the node called own (czxid ownCzxid) among names,
// for a driver that knows the czxid of every uncounted node (it reads none).
func lineOf(t *testing.T, d *Driver, lockPath string, names []string, own string, ownCzxid int64) line {
	t.Helper()
	e := &entry{zc: &zsession{}, nodes: &d.nodes, lockPath: lockPath, path: lockPath + "/" + own, czxid: ownCzxid}
	l, err := d.lineFrom(e, names, nil, false)
	if err != nil || !l.present {
		t.Fatalf("line of %s: %+v, %v", own, l, err)
	}
	return l
}

// TestOrderAcrossSequenceWrap checks the order of a line whose suffixes
// run through the counter's overflow: nodes with counted suffixes are
// ordered by them, without their czxids, and come before every node made
// from the overflow on, which are ordered by czxid.
func TestOrderAcrossSequenceWrap(t *testing.T) {
	const lockPath = "/fenced/k"
	// In creation order. Only the uncounted nodes' czxids are known: a
	// counted node's czxid is never needed.
	order := []string{
		"_c_a-lock-2147483644",
		"_c_b-lock-2147483645",
		"_c_c-lock-2147483646",
		"_c_d-lock-2147483647", // the counter's last value, or a stuck one
		"_c_e-lock--2147483648",
		"_c_f-lock-2147483647",
	}
	czxids := map[string]int64{"_c_d-lock-2147483647": 203, "_c_e-lock--2147483648": 204, "_c_f-lock-2147483647": 205}
	d := newDriver("/fenced")
	defer d.Close()
	for n, czxid := range czxids {
		d.nodes.add(lockPath+"/"+n, czxid)
	}
	// Listed in no particular order.
	names := []string{order[4], order[1], order[5], order[0], order[3], order[2]}
	for i, own := range order {
		l := lineOf(t, d, lockPath, names, own, max(czxids[own], 100+int64(i)))
		var got []string
		for _, c := range l.elders {
			got = append(got, c.name)
		}
		if want := order[:i]; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("elders of %s: %v, want %v (oldest first)", own, got, want)
		}
		if i == 0 {
			if !l.first() {
				t.Errorf("%s is the oldest but does not hold", own)
			}
			continue
		}
		if p := l.predecessor().name; p != order[i-1] {
			t.Errorf("%s waits for %s, want %s", own, p, order[i-1])
		}
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
