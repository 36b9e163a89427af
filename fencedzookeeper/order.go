package fencedzookeeper

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"
)

// Who holds a lock, and whom a waiter waits for, is decided by creation
// order: the order of the lock nodes' czxids. A plain reading of the
// sequence suffixes is never trusted, since the suffix counter stops at
// 2^31-1. A suffix in [0, 2^31-1) was given before that overflow; such
// suffixes order their nodes exactly as czxids do, and every such node is
// older than every other. So only the nodes named from the overflow on
// need their czxids read. docs/design-notes.md gives the argument, what it
// relies on, and what the overflow means for a path shared with Curator.

// child is one lock node under a lock path.
type child struct {
	name string
	// seq is the sequence suffix as the server wrote it; only a hint of
	// the order (see above).
	seq int64
	// czxid is the node's creation zxid, once read (0 before).
	czxid int64
}

// counted reports whether a lock node's sequence suffix was given before
// its lock path's counter overflowed, so that it orders the node (see
// above).
func counted(seq int64) bool { return seq >= 0 && seq < math.MaxInt32 }

// parseChildren checks that names are all lock nodes and returns them in
// the order their suffixes suggest: ascending, reading a negative suffix
// as the unsigned counter value it is. That is creation order for the
// nodes with counted suffixes, which come first; among the others it only
// decides which node to look at first, never who holds.
func parseChildren(lockPath string, names []string) ([]child, error) {
	out := make([]child, 0, len(names))
	for _, n := range names {
		i := strings.LastIndex(n, lockMarker)
		if i < 0 {
			return nil, fmt.Errorf(
				"zookeeper: lock path %s holds foreign node %q (not a lock node \"...lock-<sequence>\"): remove it or use another chroot",
				lockPath, n)
		}
		seq, err := strconv.ParseInt(n[i+len(lockMarker):], 10, 32)
		if err != nil {
			return nil, fmt.Errorf(
				"zookeeper: lock path %s holds foreign node %q (no sequence number after \"lock-\"): remove it or use another chroot",
				lockPath, n)
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

// line is what a lock node's owner knows of the nodes ahead of it.
type line struct {
	// present is false when the owner's node is gone (its session expired,
	// or an admin broke it).
	present bool
	// elders are the nodes created before the owner's, oldest first: those
	// with counted suffixes by suffix, then the others by czxid (known for
	// them; zero for counted ones, which need none).
	elders []child
}

// first reports whether the owner's node is the oldest: it holds the lock.
func (l line) first() bool { return l.present && len(l.elders) == 0 }

// predecessor returns the youngest node ahead of the owner's, the one it
// waits for; only when there is one.
func (l line) predecessor() child { return l.elders[len(l.elders)-1] }

// lookLine lists e's lock path and finds the nodes ahead of e's node.
//
// prev is the line from an earlier look by the same owner, or nil. A node
// that was not listed then was created after that listing, so after e's
// node: of the nodes with uncounted suffixes only the earlier elders still
// listed need be considered, and no czxid is read again. Without prev the
// czxid of every other uncounted node is read; with anyElder set a try
// that only needs to know whether the lock is free stops at the first
// elder found. Nodes with counted suffixes (all of them, until a lock
// path's 2^31st creation) cost no read at all: a look is one listing.
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
	var own child
	others := make([]child, 0, len(children))
	for _, c := range children {
		if e.lockPath+"/"+c.name == e.path {
			l.present, own = true, c
		} else {
			others = append(others, c)
		}
	}
	if !l.present {
		return l, nil
	}
	// children are in suffix order: counted suffixes first, ascending, so
	// the counted elders come out oldest first.
	var uncounted []child
	for _, c := range others {
		switch {
		case counted(c.seq) && counted(own.seq):
			if c.seq < own.seq {
				l.elders = append(l.elders, c)
			}
		case counted(c.seq):
			l.elders = append(l.elders, c) // ours came after the overflow
		case counted(own.seq):
			// c came after the overflow, so after ours.
		default:
			uncounted = append(uncounted, c)
		}
	}
	if len(uncounted) == 0 || anyElder && len(l.elders) > 0 {
		return l, nil
	}
	var later []child // uncounted elders, by czxid
	if prev != nil {
		listed := make(map[string]bool, len(uncounted))
		for _, c := range uncounted {
			listed[c.name] = true
		}
		for _, c := range prev.elders {
			if !counted(c.seq) && listed[c.name] {
				later = append(later, c)
			}
		}
		return line{present: true, elders: append(l.elders, later...)}, nil
	}
	// Our own nodes' czxids are known (ownNodes); only foreign ones are read.
	d.nodes.fill(e.lockPath, uncounted)
	if anyElder && len(uncounted) > 1 {
		// The suffix order's first node is almost always the holder.
		probe, err := readCzxids(e.zc.conn, e.lockPath, uncounted[:1])
		if err != nil {
			return line{}, readErr("read lock node", err)
		}
		if len(probe) == 1 && probe[0].czxid < e.czxid {
			l.elders = probe
			return l, nil
		}
		uncounted = uncounted[1:]
	}
	uncounted, err = readCzxids(e.zc.conn, e.lockPath, uncounted)
	if err != nil {
		return line{}, readErr("read lock nodes", err)
	}
	for _, c := range uncounted {
		if c.czxid < e.czxid {
			later = append(later, c)
		}
	}
	sort.Slice(later, func(i, j int) bool { return later[i].czxid < later[j].czxid })
	l.elders = append(l.elders, later...)
	return l, nil
}
