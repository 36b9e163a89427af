package consensus

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestMain lets this test binary serve as a proof worker (re-executed by
// TestProofIncumbents) for the concurrency.Mutex and zk.Lock Lockers.
func TestMain(m *testing.M) {
	proof.RegisterLocker("concurrency.Mutex", openEtcdMutex)
	proof.RegisterLocker("zk.Lock", openZKLock)
	proof.MaybeRunWorker()
	os.Exit(m.Run())
}

// hosts returns the host:port list of a scheme://h1:p1,h2:p2 address.
func hosts(addr string) ([]string, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, errors.New("address " + addr + " names no host")
	}
	return strings.Split(u.Host, ","), nil
}

// etcdMutexProof is etcd's concurrency.Mutex as a proof.Locker, on a
// session (not bound to any one Lock call) whose TTL is the lease's (whole
// seconds, at least 1); a new
// session replaces one that expired.
type etcdMutexProof struct {
	cli *clientv3.Client
	mu  sync.Mutex
	s   *concurrency.Session
}

func openEtcdMutex(_ context.Context, addr string) (proof.Locker, error) {
	eps, err := hosts(addr)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	return &etcdMutexProof{cli: cli}, nil
}

func (l *etcdMutexProof) session(ttl time.Duration) (*concurrency.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		select {
		case <-l.s.Done():
			l.s = nil
		default:
			return l.s, nil
		}
	}
	s, err := concurrency.NewSession(l.cli, concurrency.WithTTL(max(1, int((ttl+time.Second-1)/time.Second))))
	if err != nil {
		return nil, err
	}
	l.s = s
	return s, nil
}

func (l *etcdMutexProof) Lock(ctx context.Context, key string, ttl time.Duration) (proof.Unlocker, error) {
	s, err := l.session(ttl)
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(s, "/fenced-proof/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return etcdMutexHeld{m, s}, nil
}

func (l *etcdMutexProof) Close() error {
	l.mu.Lock()
	if l.s != nil {
		l.s.Close()
	}
	l.mu.Unlock()
	return l.cli.Close()
}

type etcdMutexHeld struct {
	m *concurrency.Mutex
	s *concurrency.Session
}

// Lost is the session's Done: closed when its keep-alive stops (the
// session expired, or could not be renewed).
func (h etcdMutexHeld) Lost() <-chan struct{} { return h.s.Done() }

func (h etcdMutexHeld) Unlock(ctx context.Context) error { return h.m.Unlock(ctx) }

// zkLockProof is go-zookeeper's Lock as a proof.Locker, on one connection
// whose session timeout is the lease's TTL (as the server negotiates it).
type zkLockProof struct {
	servers []string
	mu      sync.Mutex
	conn    *zk.Conn
	expired chan struct{} // closed when the current session expires
}

func openZKLock(_ context.Context, addr string) (proof.Locker, error) {
	s, err := hosts(addr)
	if err != nil {
		return nil, err
	}
	return &zkLockProof{servers: s}, nil
}

func (l *zkLockProof) connect(ttl time.Duration) (*zk.Conn, chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		conn, events, err := zk.Connect(l.servers, ttl, zk.WithLogInfo(false))
		if err != nil {
			return nil, nil, err
		}
		l.conn, l.expired = conn, make(chan struct{})
		go func() {
			for ev := range events {
				if ev.State == zk.StateExpired {
					l.mu.Lock()
					close(l.expired)
					l.expired = make(chan struct{})
					l.mu.Unlock()
				}
			}
		}()
	}
	return l.conn, l.expired, nil
}

func (l *zkLockProof) Lock(ctx context.Context, key string, ttl time.Duration) (proof.Unlocker, error) {
	conn, expired, err := l.connect(ttl)
	if err != nil {
		return nil, err
	}
	lk := zk.NewLock(conn, "/fenced-proof/"+key, zk.WorldACL(zk.PermAll))
	if err := lk.Lock(); err != nil {
		return nil, err
	}
	return zkLockHeld{lk, expired}, nil
}

func (l *zkLockProof) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
	return nil
}

type zkLockHeld struct {
	lk      *zk.Lock
	expired chan struct{}
}

// Lost is closed when the session the lock was taken in expires.
func (h zkLockHeld) Lost() <-chan struct{} { return h.expired }

func (h zkLockHeld) Unlock(context.Context) error { return h.lk.Unlock() }

// TestProofIncumbents runs concurrency.Mutex and zk.Lock under the
// incumbents' faults (proof.LockerFaults) with the proof workload, and
// writes their rows to $FENCED_PROOF_OUT/proof/incumbents-consensus.json
// for the report (scripts/proof.sh). It runs only when FENCED_PROOF_OUT is
// set. FENCED_PROOF_FAULTS (comma-separated) limits the faults.
func TestProofIncumbents(t *testing.T) {
	out := os.Getenv("FENCED_PROOF_OUT")
	if out == "" {
		t.Skip("set FENCED_PROOF_OUT (scripts/proof.sh) to run the incumbents' rows")
	}
	etcd := testenv.StartEtcd(t)
	ens := testenv.StartZooKeeper(t)
	var rows []proof.Row
	for _, lib := range []struct{ name, store string }{
		{"concurrency.Mutex", etcd.URL("")},
		{"zk.Lock", ens.URL("", "")},
	} {
		base := proof.Config{
			Locker:     lib.name,
			Store:      lib.store,
			TTL:        time.Second,
			Injections: 2,
			Command:    func() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") },
			Dir:        t.TempDir(),
			Logf:       t.Logf,
		}
		r, err := proof.RunLocker(t.Context(), lib.name, base, proofFaults())
		if err != nil {
			t.Error(err)
		}
		for _, row := range r {
			if row.Report != nil {
				t.Logf("%s %s: %+v", lib.name, row.Fault, *row.Report)
			}
		}
		rows = append(rows, r...)
	}
	if err := os.MkdirAll(filepath.Join(out, "proof"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := proof.WriteRows(filepath.Join(out, "proof", "incumbents-consensus.json"), rows); err != nil {
		t.Fatal(err)
	}
}

// proofFaults returns proof.LockerFaults, limited by FENCED_PROOF_FAULTS.
func proofFaults() []proof.Fault {
	only := os.Getenv("FENCED_PROOF_FAULTS")
	var fs []proof.Fault
	for _, f := range proof.LockerFaults {
		if only == "" || strings.Contains(","+only+",", ","+string(f)+",") {
			fs = append(fs, f)
		}
	}
	return fs
}
