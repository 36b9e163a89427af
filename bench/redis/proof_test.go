package redisbench

import (
	"context"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestMain lets this test binary serve as a proof worker (re-executed by
// TestProofIncumbents) for the redsync and redislock Lockers.
func TestMain(m *testing.M) {
	proof.RegisterLocker("redsync", openRedsync)
	proof.RegisterLocker("redislock", openRedislock)
	proof.MaybeRunWorker()
	os.Exit(m.Run())
}

// redisClient opens a go-redis client on a redis://host:port/db address.
func redisClient(addr string) (*redis.Client, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(&redis.Options{Addr: u.Host, MaxRetries: -1}), nil
}

// redsyncProof is redsync's Mutex as a proof.Locker: a single-node Redlock
// with the lease's TTL as its expiry and no extension.
type redsyncProof struct {
	c  *redis.Client
	rs *redsync.Redsync
}

func openRedsync(_ context.Context, addr string) (proof.Locker, error) {
	c, err := redisClient(addr)
	if err != nil {
		return nil, err
	}
	return redsyncProof{c, redsync.New(goredis.NewPool(c))}, nil
}

func (l redsyncProof) Lock(ctx context.Context, key string, ttl time.Duration) (proof.Unlocker, error) {
	m := l.rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return redsyncHeld{m}, nil
}

func (l redsyncProof) Close() error { return l.c.Close() }

type redsyncHeld struct{ m *redsync.Mutex }

// Lost is nil: redsync never tells a holder its lock expired.
func (redsyncHeld) Lost() <-chan struct{} { return nil }

func (h redsyncHeld) Unlock(ctx context.Context) error {
	_, err := h.m.UnlockContext(ctx)
	return err
}

// redislockProof is bsm/redislock as a proof.Locker, retrying every 10 ms
// until the context ends.
type redislockProof struct {
	c *redis.Client
	l *redislock.Client
}

func openRedislock(_ context.Context, addr string) (proof.Locker, error) {
	c, err := redisClient(addr)
	if err != nil {
		return nil, err
	}
	return redislockProof{c, redislock.New(c)}, nil
}

func (l redislockProof) Lock(ctx context.Context, key string, ttl time.Duration) (proof.Unlocker, error) {
	lk, err := l.l.Obtain(ctx, key, ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return redislockHeld{lk}, nil
}

func (l redislockProof) Close() error { return l.c.Close() }

type redislockHeld struct{ lk *redislock.Lock }

// Lost is nil: redislock never tells a holder its lock expired.
func (redislockHeld) Lost() <-chan struct{} { return nil }

func (h redislockHeld) Unlock(ctx context.Context) error { return h.lk.Release(ctx) }

// TestProofIncumbents runs redsync and redislock under the incumbents'
// faults (proof.LockerFaults on one server, M7 on a primary with an
// asynchronous replica) with the proof workload, and writes their
// rows to $FENCED_PROOF_OUT/proof/incumbents-redis.json for the report
// (scripts/proof.sh). It runs only when FENCED_PROOF_OUT is set.
// FENCED_PROOF_FAULTS (comma-separated) limits the faults.
func TestProofIncumbents(t *testing.T) {
	out := os.Getenv("FENCED_PROOF_OUT")
	if out == "" {
		t.Skip("set FENCED_PROOF_OUT (scripts/proof.sh) to run the incumbents' rows")
	}
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	// M7 runs on a primary with an asynchronous replica, behind a proxy
	// that follows the failover.
	failover := testenv.StartRedisFailover(t)
	var rows []proof.Row
	for _, lib := range []string{"redsync", "redislock"} {
		for _, topo := range []struct {
			store    string
			failover proof.Failover
			faults   []proof.Fault
		}{
			{"redis://" + srv.Addr() + "/0", nil, proofFaults(proof.LockerFaults)},
			{failover.URL(), failover, proofFaults([]proof.Fault{proof.FailoverReplica})},
		} {
			base := proof.Config{
				Locker:     lib,
				Store:      topo.store,
				Failover:   topo.failover,
				TTL:        time.Second,
				Injections: 2,
				Command:    func() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") },
				Dir:        t.TempDir(),
				Logf:       t.Logf,
			}
			r, err := proof.RunLocker(t.Context(), lib, base, topo.faults)
			if err != nil {
				t.Error(err)
			}
			for _, row := range r {
				if row.Report != nil {
					t.Logf("%s %s: %+v", lib, row.Fault, *row.Report)
				}
			}
			rows = append(rows, r...)
		}
	}
	if err := os.MkdirAll(filepath.Join(out, "proof"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := proof.WriteRows(filepath.Join(out, "proof", "incumbents-redis.json"), rows); err != nil {
		t.Fatal(err)
	}
}

// proofFaults returns faults, limited by FENCED_PROOF_FAULTS.
func proofFaults(faults []proof.Fault) []proof.Fault {
	only := os.Getenv("FENCED_PROOF_FAULTS")
	var fs []proof.Fault
	for _, f := range faults {
		if only == "" || strings.Contains(","+only+",", ","+string(f)+",") {
			fs = append(fs, f)
		}
	}
	return fs
}
