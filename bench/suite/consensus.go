package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// etcdBackend is a single-node etcd: fenced against concurrency.Mutex.
func etcdBackend(tb *testenv.MainTB) *backend {
	cluster := testenv.StartEtcd(tb)
	eps := cluster.Endpoints()
	url := cluster.URL("")
	newClient := func() (*clientv3.Client, error) { return newEtcdClient(eps) }
	holders := []holderImpl{
		{name: "fenced", how: "Client auto-renew on the driver's session", open: openFencedHolder(url)},
		{name: "etcd-mutex", how: "one session (lease keep-alive) for every mutex",
			open: func(ctx context.Context, ttl time.Duration) (holder, error) {
				cli, err := newClient()
				if err != nil {
					return nil, err
				}
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl.Seconds())))
				if err != nil {
					cli.Close()
					return nil, err
				}
				return &etcdMutexHolder{cli: cli, s: s}, nil
			}},
	}
	metrics := "http://" + eps[0] + "/metrics"
	return &backend{
		name: "etcd", impls: etcdImpls(append([]string{url}, eps...)), holders: holders,
		spawn: spawnSpec{Set: "etcd", Args: append([]string{url}, eps...)},
		count: etcdMessages(metrics, false), renewalCount: etcdMessages(metrics, true),
		renewalTTL: renewalTTL,
		note: "single-node etcd; requests are gRPC messages received (grpc_server_msg_received_total), " +
			"keep-alives left out except in the renewal workload",
	}
}

// etcdMessages counts the gRPC messages etcd received, from its /metrics;
// without keepAlives, LeaseKeepAlive's are left out (the idle sessions of
// the other implementations send them all along).
func etcdMessages(url string, keepAlives bool) counter {
	return func() (int64, error) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var total float64
		found := false
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "grpc_server_msg_received_total{") {
				continue
			}
			if !keepAlives && strings.Contains(line, `grpc_method="LeaseKeepAlive"`) {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				return 0, err
			}
			total += v
			found = true
		}
		if !found {
			return 0, fmt.Errorf("%s has no grpc_server_msg_received_total", url)
		}
		return int64(total), sc.Err()
	}
}

// etcdMutexProcess is one etcd client; each worker gets its own session,
// since two Mutexes on one session and one key would both "hold" it.
type etcdMutexProcess struct {
	cli      *clientv3.Client
	mu       sync.Mutex
	sessions []*concurrency.Session
}

func (p *etcdMutexProcess) worker() (locker, error) {
	s, err := concurrency.NewSession(p.cli, concurrency.WithTTL(int(benchTTL.Seconds())))
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.sessions = append(p.sessions, s)
	p.mu.Unlock()
	return lockFunc(func(ctx context.Context, key string) (func(context.Context) error, error) {
		m := concurrency.NewMutex(s, "mutex/"+key)
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		return m.Unlock, nil
	}), nil
}

func (p *etcdMutexProcess) close() {
	for _, s := range p.sessions {
		s.Close()
	}
	p.cli.Close()
}

// etcdMutexHolder holds many Mutexes on one session.
type etcdMutexHolder struct {
	cli *clientv3.Client
	s   *concurrency.Session
	mu  sync.Mutex
	ms  []*concurrency.Mutex
}

func (h *etcdMutexHolder) acquire(ctx context.Context, key string, ttl time.Duration) error {
	m := concurrency.NewMutex(h.s, "mutex/"+key)
	if err := m.TryLock(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	h.ms = append(h.ms, m)
	h.mu.Unlock()
	return nil
}

func (h *etcdMutexHolder) lost() (int, error) {
	select {
	case <-h.s.Done():
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ms), errors.New("session ended")
	default:
		return 0, nil
	}
}

func (h *etcdMutexHolder) releaseAll(ctx context.Context) {
	h.mu.Lock()
	ms := h.ms
	h.mu.Unlock()
	parallel(len(ms), func(i int) { ms[i].Unlock(ctx) })
}

func (h *etcdMutexHolder) close() { h.s.Close(); h.cli.Close() }

// zookeeperBackend is a standalone ZooKeeper: fenced against
// go-zookeeper's Lock.
func zookeeperBackend(tb *testenv.MainTB) *backend {
	ens := testenv.StartZooKeeper(tb)
	servers := ens.Servers()
	url := ens.URL("/bench", "")
	connect := func() (*zk.Conn, error) { return connectZK(servers) }
	holders := []holderImpl{
		{name: "fenced", how: "Client auto-renew on the driver's session", open: openFencedHolder(url)},
		{name: "zk-lock", how: "one session (heartbeats) for every lock",
			open: func(ctx context.Context, ttl time.Duration) (holder, error) {
				conn, err := connect()
				if err != nil {
					return nil, err
				}
				return &zkLockHolder{conn: conn}, nil
			}},
	}
	return &backend{
		name: "zookeeper", impls: zookeeperImpls(append([]string{url}, servers...)), holders: holders,
		spawn: spawnSpec{Set: "zookeeper", Args: append([]string{url}, servers...)},
		count: zkPackets(servers[0]), renewalCount: zkPackets(servers[0]),
		renewalTTL: renewalTTL,
		note: "standalone ZooKeeper; requests are packets received (mntr's zk_packets_received, session pings included); " +
			"zk.Lock has no context and no TTL of its own (the session's)",
	}
}

func zkLock(conn *zk.Conn) lockFunc {
	return func(ctx context.Context, key string) (func(context.Context) error, error) {
		l := zk.NewLock(conn, "/gozk/"+key, zk.WorldACL(zk.PermAll))
		if err := l.Lock(); err != nil {
			return nil, err
		}
		return func(context.Context) error { return l.Unlock() }, nil
	}
}

// zkPackets counts the packets the server received (mntr).
func zkPackets(addr string) counter {
	return func() (int64, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("mntr")); err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "zk_packets_received\t"); ok {
				return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		return 0, fmt.Errorf("mntr from %s has no zk_packets_received (%v)", addr, sc.Err())
	}
}

// zkLockHolder holds many zk.Locks on one session.
type zkLockHolder struct {
	conn *zk.Conn
	mu   sync.Mutex
	ls   []*zk.Lock
}

func (h *zkLockHolder) acquire(ctx context.Context, key string, ttl time.Duration) error {
	l := zk.NewLock(h.conn, "/gozk/"+key, zk.WorldACL(zk.PermAll))
	if err := l.Lock(); err != nil {
		return err
	}
	h.mu.Lock()
	h.ls = append(h.ls, l)
	h.mu.Unlock()
	return nil
}

// lost counts every lock as lost once the session is gone.
func (h *zkLockHolder) lost() (int, error) {
	if st := h.conn.State(); st != zk.StateHasSession {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ls), fmt.Errorf("session state %v", st)
	}
	return 0, nil
}

func (h *zkLockHolder) releaseAll(ctx context.Context) {
	h.mu.Lock()
	ls := h.ls
	h.mu.Unlock()
	parallel(len(ls), func(i int) { ls[i].Unlock() })
}

func (h *zkLockHolder) close() { h.conn.Close() }

func newEtcdClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
}

// etcdImpls are the implementations on etcd: args are fenced's store URL,
// then the endpoints.
func etcdImpls(args []string) []impl {
	url, eps := args[0], args[1:]
	return append(fencedImpls([]string{url}), impl{name: "etcd-mutex", open: func(context.Context) (process, error) {
		cli, err := newEtcdClient(eps)
		if err != nil {
			return nil, err
		}
		return &etcdMutexProcess{cli: cli}, nil
	}})
}

func connectZK(servers []string) (*zk.Conn, error) {
	conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	return conn, err
}

// zookeeperImpls are the implementations on ZooKeeper: args are fenced's
// store URL, then the servers.
func zookeeperImpls(args []string) []impl {
	url, servers := args[0], args[1:]
	return append(fencedImpls([]string{url}), impl{name: "zk-lock", open: func(context.Context) (process, error) {
		conn, err := connectZK(servers)
		if err != nil {
			return nil, err
		}
		return clientProcess{l: zkLock(conn), closers: []func() error{func() error { conn.Close(); return nil }}}, nil
	}})
}
