package fencedzookeeper

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/keyname"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// adminConn returns a connection for admin reads: the driver's
// longest-lived session.
func (d *Driver) adminConn() (*zk.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fenced.ErrClosed
	}
	var best *zsession
	for _, zc := range d.sessions {
		if best == nil || zc.timeout > best.timeout {
			best = zc
		}
	}
	if best == nil {
		return nil, fmt.Errorf("zookeeper: %w: no session", fenced.ErrUnavailable)
	}
	return best.conn, nil
}

// holder reads the lock at lockPath: its holder's node (name "" when free),
// its stat and data, and the lock path's mzxid. fenced creates every lock
// node in one transaction with a write to the lock path. So the mzxid is
// the czxid of the last node fenced created there. When the lock is free,
// it is the highest fence fenced has handed out on it (or reserved, for a
// waiter that gave up).
func (d *Driver) holder(conn *zk.Conn, lockPath string) (name string, stat *zk.Stat, data []byte, record uint64, err error) {
	ok, pstat, err := conn.Exists(lockPath)
	if err == nil && !ok {
		err = zk.ErrNoNode
	}
	if err != nil {
		return "", nil, nil, 0, err
	}
	record = uint64(pstat.Mzxid)
	names, _, err := conn.Children(lockPath)
	if err != nil {
		return "", nil, nil, 0, err
	}
	children, err := parseChildren(lockPath, names)
	if err != nil {
		return "", nil, nil, 0, err
	}
	// The holder is the oldest node (see order.go): the first in suffix
	// order when its suffix is counted, else (all the nodes left came
	// from the counter's overflow on) the oldest by czxid. Nodes released
	// meanwhile drop out.
	for len(children) > 0 {
		i := 0
		if !counted(children[0].seq) {
			if children, err = readCzxids(conn, lockPath, children); err != nil {
				return "", nil, nil, 0, err
			}
			if len(children) == 0 {
				break
			}
			i = oldest(children)
		}
		data, stat, err = conn.Get(lockPath + "/" + children[i].name)
		if errors.Is(err, zk.ErrNoNode) {
			children = append(children[:i], children[i+1:]...)
			continue
		}
		if err != nil {
			return "", nil, nil, 0, err
		}
		return children[i].name, stat, data, record, nil
	}
	return "", nil, nil, record, nil
}

// setHolder records a holder's owner in info: the fenced owner token
// shortened and digested, or a foreign holder's session (Curator stores
// the client's address), which has no digest.
func setHolder(info *driver.LeaseInfo, stat *zk.Stat, data []byte) {
	if len(data) == 32 {
		token.Set(info, string(data))
		return
	}
	info.Owner = fmt.Sprintf("session:%x", stat.EphemeralOwner)
}

// remaining is the time left on a grant this driver holds; zero for other
// holders, whose session timeouts the server does not expose.
func (d *Driver) remaining(key string, stat *zk.Stat, data []byte) time.Duration {
	if e := d.grants.Lookup(key, string(data)); e != nil && e.czxid == stat.Czxid {
		if dl, ok := d.grants.Deadline(e); ok {
			return max(0, time.Until(dl))
		}
	}
	return 0
}

// Inspect implements driver.Driver. A lock path that does not exist was
// never granted.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	conn, err := d.adminConn()
	if err != nil {
		return driver.LeaseInfo{}, err
	}
	info := driver.LeaseInfo{Key: key}
	name, stat, data, record, err := d.holder(conn, d.lockPath(key))
	if errors.Is(err, zk.ErrNoNode) {
		return info, fmt.Errorf("zookeeper: inspect %q: %w", key, fenced.ErrNotFound)
	}
	if err != nil {
		if strings.Contains(err.Error(), "foreign node") {
			return info, err
		}
		return info, readErr("inspect", err)
	}
	if name == "" {
		info.Fence = record
		return info, nil
	}
	info.Held, info.Fence = true, uint64(stat.Czxid)
	setHolder(&info, stat, data)
	info.Remaining = d.remaining(key, stat, data)
	return info, nil
}

// List implements driver.Driver.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	conn, err := d.adminConn()
	if err != nil {
		return nil, err
	}
	names, _, err := conn.Children(d.root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, readErr("list", err)
	}
	esc := keyname.EscapePrefix(prefix)
	var (
		mu   sync.Mutex
		out  []driver.LeaseInfo
		errs []error
		wg   sync.WaitGroup
	)
	for _, n := range names {
		if !strings.HasPrefix(n, esc) {
			continue
		}
		key, ok := keyname.Unescape(n)
		if !ok || !strings.HasPrefix(key, prefix) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			name, stat, data, _, err := d.holder(conn, d.lockPath(key))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, zk.ErrNoNode):
			case err != nil:
				errs = append(errs, err)
			case name != "":
				info := driver.LeaseInfo{Key: key, Held: true, Fence: uint64(stat.Czxid), Remaining: d.remaining(key, stat, data)}
				setHolder(&info, stat, data)
				out = append(out, info)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, readErr("list", errors.Join(errs...))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Break implements driver.Driver: it deletes the holder's node (a Curator
// holder's too).
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	conn, err := d.adminConn()
	if err != nil {
		return driver.LeaseInfo{}, err
	}
	lockPath := d.lockPath(key)
	info := driver.LeaseInfo{Key: key}
	name, stat, data, _, err := d.holder(conn, lockPath)
	if errors.Is(err, zk.ErrNoNode) || err == nil && name == "" {
		return info, fmt.Errorf("zookeeper: break %q: %w", key, fenced.ErrNotHeld)
	}
	if err != nil {
		return info, readErr("break", err)
	}
	info.Held, info.Fence = true, uint64(stat.Czxid)
	setHolder(&info, stat, data)
	err = conn.Delete(lockPath+"/"+name, stat.Version)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return info, fmt.Errorf("zookeeper: break %q: %w: released meanwhile", key, fenced.ErrNotHeld)
	}
	if err != nil {
		return info, writeErr("break", err)
	}
	return info, nil
}
