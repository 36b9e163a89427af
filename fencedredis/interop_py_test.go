package fencedredis_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// pyLockPeer is a Python service using redis-py's own Lock recipe (SET NX
// PX with a random token; compare-and-delete release) on the Redis key where
// fenced keeps a lease's grant. It reads commands on stdin and answers one
// line each.
const pyLockPeer = `
import sys, redis
from redis.exceptions import LockNotOwnedError
host, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = redis.Redis(host=host, port=port)
held = None
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "hold":
        held = r.lock(name, timeout=30, blocking_timeout=10)
        print("held" if held.acquire() else "timeout", flush=True)
    elif cmd == "release":
        held.release()
        print("released", flush=True)
    elif cmd == "try":
        l = r.lock(name, timeout=30)
        if l.acquire(blocking=False):
            l.release()
            print("acquired", flush=True)
        else:
            print("refused", flush=True)
    elif cmd == "release-foreign":
        l = r.lock(name, timeout=30)
        l.local.token = b"not-the-owner"
        try:
            l.release()
            print("deleted", flush=True)
        except LockNotOwnedError:
            print("not-owned", flush=True)
`

type pyPeer struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

func (p *pyPeer) do(cmd string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		p.t.Fatal(err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.t.Fatalf("redis-py peer, after %q: %v", cmd, err)
	}
	return strings.TrimSpace(line)
}

// TestInteropWithRedisPyLock shows that a fenced lease and redis-py's Lock
// on the same Redis key exclude each other in both directions, and that
// neither side deletes the other's grant. fenced treats redis-py's token as
// a foreign value: it refuses at once with ErrForeignValue naming the key
// rather than waiting on a grant whose expiry it does not manage.
func TestInteropWithRedisPyLock(t *testing.T) {
	python := testenv.RequireBinary(t, "python3-redis", "/usr/bin/python3")
	if err := exec.Command(python, "-I", "-c", "import redis").Run(); err != nil {
		t.Fatalf("redis-py missing for %s (Debian package python3-redis): %v", python, err)
	}
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "interop:job"
	lockKey := rediskit.Layout{Prefix: rediskit.DefaultPrefix}.Keys(key).Lock

	cmd := exec.CommandContext(ctx, python, "-I", "-c", pyLockPeer, "127.0.0.1", strconv.Itoa(srv.Port), lockKey)
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("redis-py peer: %v\n%s", err, stderr.String())
		}
	}()
	py := &pyPeer{t: t, in: in, out: bufio.NewReader(outPipe)}

	c, err := fenced.Open(ctx, srv.URL(), &fenced.Options{MinFence: fenced.FenceRepeatable})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// redis-py holds: fenced refuses to touch the foreign grant, with an
	// error naming it, and takes the key once redis-py releases.
	if got := py.do("hold"); got != "held" {
		t.Fatalf("redis-py hold: %s", got)
	}
	_, err = c.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 5 * time.Second})
	if !errors.Is(err, fencedredis.ErrForeignValue) || !strings.Contains(err.Error(), lockKey) {
		t.Fatalf("fenced while redis-py holds: %v, want ErrForeignValue naming %s", err, lockKey)
	}
	if got := py.do("try"); got != "refused" {
		t.Fatalf("redis-py's own lock after fenced's attempt: %s, want still held (refused)", got)
	}
	if got := py.do("release"); got != "released" {
		t.Fatalf("redis-py release: %s", got)
	}
	lease, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("fenced after redis-py released: %v", err)
	}
	if lease.Fence() == 0 {
		t.Fatal("no fence")
	}

	// fenced holds: redis-py is refused and cannot delete fenced's grant.
	if got := py.do("try"); got != "refused" {
		t.Fatalf("redis-py while fenced holds: %s, want refused", got)
	}
	if got := py.do("release-foreign"); got != "not-owned" {
		t.Fatalf("redis-py release of fenced's grant: %s, want not-owned", got)
	}
	if err := lease.Renew(ctx); err != nil {
		t.Fatalf("fenced's lease after redis-py's attempts: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := py.do("try"); got != "acquired" {
		t.Fatalf("redis-py after fenced released: %s, want acquired", got)
	}
}
