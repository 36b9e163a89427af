package testenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisFailover is a Redis primary with one asynchronous replica, behind a
// proxy that clients reach as "the primary". It is the topology of an
// asynchronous failover (Sentinel, a managed service). There, a grant the
// replica never received is lost when the replica is promoted. CutReplica
// stops replication. Failover kills the primary, promotes the replica,
// moves the proxy to it and gives it a new replica. So the topology can
// fail over again.
type RedisFailover struct {
	t testing.TB
	// Proxy is where clients connect; Primary and Replica are the servers
	// behind it now.
	Proxy            *Proxy
	Primary, Replica *Redis
}

// StartRedisFailover starts a primary, its replica (synced) and the proxy.
func StartRedisFailover(t testing.TB) *RedisFailover {
	t.Helper()
	primary := StartRedis(t, RedisConfig{})
	replica := StartRedis(t, RedisConfig{ReplicaOf: primary})
	return &RedisFailover{t: t, Proxy: StartProxy(t, primary.Addr()), Primary: primary, Replica: replica}
}

// URL returns a redis:// URL of the proxy.
func (f *RedisFailover) URL() string { return "redis://" + f.Proxy.Addr + "/0" }

// CutReplica cuts the replica off. It is stopped (SIGSTOP) and the primary
// drops its replication link. So nothing the primary does after CutReplica
// returns reaches it.
func (f *RedisFailover) CutReplica() error {
	if err := f.Replica.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	_, err := f.Primary.Do("CLIENT", "KILL", "TYPE", "replica")
	return err
}

// Failover kills the primary with SIGKILL (whatever it did not send is
// gone). It continues the replica and promotes it (REPLICAOF NO ONE). Then
// it moves the proxy to it, closing every client connection, as clients
// following a failover reconnect to the new primary. Last, the new primary
// gets a new replica (synced before Failover returns).
func (f *RedisFailover) Failover() error {
	f.Primary.Kill()
	if err := f.Replica.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	if _, err := f.Replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
		return fmt.Errorf("testenv: promote the replica: %w", err)
	}
	f.Proxy.Retarget(f.Replica.Addr())
	f.Primary, f.Replica = f.Replica, StartRedis(f.t, RedisConfig{ReplicaOf: f.Replica})
	return nil
}

// Do sends one command to the server on a new connection. It returns its
// reply's first line (without the type byte); an error reply is an error.
func (r *Redis) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr(), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var req strings.Builder
	if r.Config.Password != "" {
		fmt.Fprintf(&req, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(r.Config.Password), r.Config.Password)
	}
	fmt.Fprintf(&req, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(req.String())); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	replies := 1
	if r.Config.Password != "" {
		replies = 2
	}
	var line string
	for range replies {
		if line, err = br.ReadString('\n'); err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, "-") {
			return "", fmt.Errorf("redis %s: %s", strings.Join(args, " "), line[1:])
		}
	}
	if line == "" {
		return "", fmt.Errorf("redis %s: empty reply", strings.Join(args, " "))
	}
	if n, err := strconv.Atoi(line[1:]); err == nil && line[0] == '$' && n >= 0 {
		// A bulk string: its content, not its length.
		b := make([]byte, n+2)
		if _, err := io.ReadFull(br, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	}
	return line[1:], nil
}

// Stat returns the integer field name of the server's INFO section
// (total_commands_processed of "stats", say), failing t if it is missing.
func (r *Redis) Stat(t testing.TB, section, name string) int64 {
	t.Helper()
	info, err := r.Do("INFO", section)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("redis INFO %s: %s: %v", section, name, err)
			}
			return n
		}
	}
	t.Fatalf("redis INFO %s has no %s", section, name)
	return 0
}
