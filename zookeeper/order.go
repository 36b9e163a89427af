package zookeeper

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Who holds a lock, and whom a waiter waits for, is decided by the czxid of
// the lock nodes (the zxid of the transaction that created each), never by
// their sequence suffix.
//
// The suffix is the lock path's child version (cversion) when the node was
// created: a signed 32-bit counter of child creations that fenced never
// resets, since it never deletes lock paths. After 2^31 creations under one
// lock path it overflows, and ZooKeeper (3.5 and later; 3.8 tested) then
// keeps naming every new node "...-2147483647" (its data tree refuses the
// lower counter that the overflow gives, so the counter stops), except
// that creations in flight together may get "-2147483648" and upwards.
// Ordered by suffix, a new node then ties with or sorts before the holder,
// and two owners hold the key. The czxid is 64 bits wide and strictly
// increasing across the whole ensemble (epoch in the high half): it cannot
// wrap, and it orders nodes by creation whatever their names.
//
// Curator's InterProcessMutex (and kazoo's Lock) order by the suffix as a
// string. Before a lock path's 2^31st child creation that is the same
// order as czxid order (the suffix is zero-padded to ten digits and grows
// with each creation), so a fenced lease and a Curator mutex exclude each
// other. After it, Curator's own order is wrong: Curator clients may hold
// together, and one may hold beside a fenced holder; fenced leases still
// exclude each other. A lock path shared with Curator past that point must
// be recycled: delete it while no lock node is under it (ZooKeeper refuses
// to delete a path that has children, so this cannot break a holder), and
// both libraries create it again, with the counter at zero.

// child is one lock node under a lock path.
type child struct {
	name string
	// seq is the sequence suffix as the server wrote it; only a hint of
	// the order (see above).
	seq int64
	// czxid is the node's creation zxid, once read (0 before).
	czxid int64
}

// parseChildren checks that names are all lock nodes and returns them in
// the order their suffixes suggest: ascending, reading a negative suffix
// as the unsigned counter value it is. That is creation order as long as
// the counter has not wrapped within the nodes' lifetimes; it only decides
// which node to look at first, never who holds.
func parseChildren(lockPath string, names []string) ([]child, error) {
	out := make([]child, 0, len(names))
	for _, n := range names {
		i := strings.LastIndex(n, lockMarker)
		if i < 0 {
			return nil, fmt.Errorf("zookeeper: lock path %s holds foreign node %q (not a lock node \"...lock-<sequence>\"): remove it or use another chroot", lockPath, n)
		}
		seq, err := strconv.ParseInt(n[i+len(lockMarker):], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("zookeeper: lock path %s holds foreign node %q (no sequence number after \"lock-\"): remove it or use another chroot", lockPath, n)
		}
		out = append(out, child{name: n, seq: seq})
	}
	sort.Slice(out, func(i, j int) bool {
		si, sj := uint32(out[i].seq), uint32(out[j].seq)
		if si != sj {
			return si < sj
		}
		return out[i].name < out[j].name
	})
	return out, nil
}

// statConcurrency bounds the reads in flight when the driver reads the
// czxids of many lock nodes.
const statConcurrency = 32

// readCzxids fills in the czxid of every child that lacks one, reading
// them concurrently (pipelined on conn), and drops the children deleted
// meanwhile. The order of children is kept.
func readCzxids(conn *zk.Conn, lockPath string, children []child) ([]child, error) {
	gone := make([]bool, len(children))
	errs := make([]error, len(children))
	sem := make(chan struct{}, statConcurrency)
	var wg sync.WaitGroup
	for i := range children {
		if children[i].czxid != 0 {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ok, stat, err := conn.Exists(lockPath + "/" + children[i].name)
			switch {
			case err != nil:
				errs[i] = err
			case !ok:
				gone[i] = true
			default:
				children[i].czxid = stat.Czxid
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := children[:0]
	for i, c := range children {
		if !gone[i] {
			out = append(out, c)
		}
	}
	return out, nil
}

// ownNodes are the czxids of the lock nodes this driver created (or
// adopted) and still tracks, by full path, so that a look at a line of
// nodes mostly made by this process reads no czxid from the server. A
// path is a safe key: its name carries the creating entry's random UUID
// (the protected prefix), so no other node ever has it, whatever the
// sequence counter does, and a node's czxid never changes. An entry that
// outlives its node (the session expired) only leaves a name that is
// never listed again, until the entry is forgotten.
type ownNodes struct {
	mu     sync.Mutex
	czxids map[string]int64
}

// add records the node at path with its czxid.
func (o *ownNodes) add(path string, czxid int64) {
	if path == "" || czxid == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.czxids == nil {
		o.czxids = map[string]int64{}
	}
	o.czxids[path] = czxid
}

// remove forgets the node at path if it was recorded with czxid.
func (o *ownNodes) remove(path string, czxid int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c, ok := o.czxids[path]; ok && c == czxid {
		delete(o.czxids, path)
	}
}

// fill sets the czxid of every child of lockPath that is a node of ours.
func (o *ownNodes) fill(lockPath string, children []child) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range children {
		if c, ok := o.czxids[lockPath+"/"+children[i].name]; ok && children[i].czxid == 0 {
			children[i].czxid = c
		}
	}
}

// oldest returns the index of the child with the lowest czxid (all known),
// or -1 when there are none.
func oldest(children []child) int {
	best := -1
	for i, c := range children {
		if best < 0 || c.czxid < children[best].czxid {
			best = i
		}
	}
	return best
}

// newest returns the index of the child with the highest czxid (all
// known), or -1 when there are none.
func newest(children []child) int {
	best := -1
	for i, c := range children {
		if best < 0 || c.czxid > children[best].czxid {
			best = i
		}
	}
	return best
}

// line is what a lock node's owner knows of the nodes ahead of it.
type line struct {
	// present is false when the owner's node is gone (its session expired,
	// or an admin broke it).
	present bool
	// elders are the nodes created before the owner's, with their czxids.
	elders []child
}

// first reports whether the owner's node is the oldest: it holds the lock.
func (l line) first() bool { return l.present && len(l.elders) == 0 }

// lookLine lists e's lock path and finds the nodes ahead of e's node.
//
// prev is the line from an earlier look by the same owner, or nil. A node
// that was not listed then was created after that listing, so after e's
// node: only the earlier elders still listed need be considered, and no
// czxid is read again (a waiter's look after its predecessor went costs
// one listing). Without prev the czxid of every other node is read; with
// anyElder set it stops at the first elder found (a try that only needs
// to know whether the lock is free reads one node when it is held).
func (d *Driver) lookLine(e *entry, prev *line, anyElder bool) (line, error) {
	names, _, err := e.zc.conn.Children(e.lockPath)
	if err != nil {
		return line{}, readErr("list lock nodes", err)
	}
	return d.lineFrom(e, names, prev, anyElder)
}

// syncLookLine is lookLine after a sync with the leader, sent back to back
// with the listing (zk.Conn.SyncChildren): the listing reflects the
// leader's state when the sync reached it. The caller has checked the
// session's headroom (awaitHeadroom) before.
func (d *Driver) syncLookLine(e *entry, prev *line) (line, error) {
	names, _, syncErr, err := e.zc.conn.SyncChildren(e.lockPath, e.lockPath)
	if syncErr != nil && !errors.Is(syncErr, zk.ErrNoNode) {
		return line{}, readErr("sync", syncErr)
	}
	if err != nil {
		return line{}, readErr("list lock nodes", err)
	}
	return d.lineFrom(e, names, prev, false)
}

// lineFrom is lookLine on names, a listing of e's lock path.
func (d *Driver) lineFrom(e *entry, names []string, prev *line, anyElder bool) (line, error) {
	children, err := parseChildren(e.lockPath, names)
	if err != nil {
		return line{}, err
	}
	var l line
	others := make([]child, 0, len(children))
	for _, c := range children {
		if e.lockPath+"/"+c.name == e.path {
			l.present = true
		} else {
			others = append(others, c)
		}
	}
	if !l.present {
		return l, nil
	}
	if prev != nil {
		listed := make(map[string]bool, len(others))
		for _, c := range others {
			listed[c.name] = true
		}
		for _, c := range prev.elders {
			if listed[c.name] {
				l.elders = append(l.elders, c)
			}
		}
		return l, nil
	}
	// Our own nodes' czxids are known (ownNodes); only foreign ones are read.
	d.nodes.fill(e.lockPath, others)
	if anyElder && len(others) > 1 {
		// The suffix order's first node is almost always the holder.
		probe, err := readCzxids(e.zc.conn, e.lockPath, others[:1])
		if err != nil {
			return line{}, readErr("read lock node", err)
		}
		if len(probe) == 1 && probe[0].czxid < e.czxid {
			l.elders = probe
			return l, nil
		}
		others = others[1:]
	}
	others, err = readCzxids(e.zc.conn, e.lockPath, others)
	if err != nil {
		return line{}, readErr("read lock nodes", err)
	}
	for _, c := range others {
		if c.czxid < e.czxid {
			l.elders = append(l.elders, c)
		}
	}
	return l, nil
}
