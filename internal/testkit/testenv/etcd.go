package testenv

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// EtcdMember is one etcd server started for a test.
type EtcdMember struct {
	Name      string
	ClientURL string // http://127.0.0.1:port
	Endpoint  string // 127.0.0.1:port
	PeerURL   string
	DataDir   string

	args []string
	t    testing.TB
	proc *Process
	host *NetHost // nil: loopback
}

// EtcdCluster is a set of etcd members forming one cluster.
type EtcdCluster struct {
	Members []*EtcdMember
}

// Endpoints returns the members' client endpoints (host:port).
func (c *EtcdCluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Endpoint)
	}
	return eps
}

// URL returns an etcd:// store URL naming every member, with query (which
// may be empty) appended.
func (c *EtcdCluster) URL(query string) string {
	u := "etcd://" + strings.Join(c.Endpoints(), ",")
	if query != "" {
		u += "/?" + query
	}
	return u
}

// StartEtcd starts a single-node etcd (Debian package etcd-server, or the
// build FENCED_ETCD_DIR names) on free loopback ports and stops it when the
// test ends.
func StartEtcd(t testing.TB) *EtcdCluster { return StartEtcdCluster(t, 1) }

// StartEtcdCluster starts an n-member etcd cluster on free loopback ports.
// Heartbeat and election timeouts are short (50ms/500ms) so failover
// completes in about a second, which also lowers the server's minimum lease
// TTL to one second.
func StartEtcdCluster(t testing.TB, n int) *EtcdCluster {
	t.Helper()
	return startEtcdCluster(t, n, nil)
}

// StartEtcdClusterOn starts one etcd member on each host of a Net, for
// partitions at the packet level (NetHost.Cut). Only processes on the Net's
// hosts can reach it.
func StartEtcdClusterOn(t testing.TB, hosts ...*NetHost) *EtcdCluster {
	t.Helper()
	return startEtcdCluster(t, len(hosts), hosts)
}

func startEtcdCluster(t testing.TB, n int, hosts []*NetHost) *EtcdCluster {
	t.Helper()
	EtcdBinary(t) // fails the test if it is missing
	dir := TempDir(t, "etcd")
	c := &EtcdCluster{}
	var initial []string
	for i := 0; i < n; i++ {
		cp, pp := FreePort(t), FreePort(t)
		client, peer := Addr(cp), Addr(pp)
		var host *NetHost
		if hosts != nil {
			host = hosts[i]
			client, peer = host.Addr(2379), host.Addr(2380)
		}
		m := &EtcdMember{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: "http://" + client,
			Endpoint:  client,
			PeerURL:   "http://" + peer,
			DataDir:   filepath.Join(dir, fmt.Sprintf("m%d", i)),
			t:         t,
			host:      host,
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		m.args = []string{
			"--name", m.Name,
			"--data-dir", m.DataDir,
			"--listen-client-urls", m.ClientURL,
			"--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL,
			"--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", "fenced-test",
			"--heartbeat-interval", "50",
			"--election-timeout", "500",
			"--logger", "zap",
			"--log-level", "warn",
		}
		m.Start()
	}
	for _, m := range c.Members {
		m.proc.WaitPort(t, m.Endpoint, 30*time.Second)
	}
	if hosts == nil { // a Net's hosts are out of this process's reach
		c.waitLeader(t, 60*time.Second)
	}
	return c
}

// waitLeader waits until every member reports a leader and serves a
// quorum read (etcd's /health), so a test starts on a settled cluster.
// A busy machine may take seconds over its first election.
func (c *EtcdCluster) waitLeader(t testing.TB, bound time.Duration) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(bound)
	for _, m := range c.Members {
		for {
			body, err := etcdHealth(hc, m.ClientURL)
			if err == nil && strings.Contains(body, `"health":"true"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("etcd cluster: %s not healthy within %v: %q, %v", m.Name, bound, body, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func etcdHealth(hc *http.Client, clientURL string) (string, error) {
	resp, err := hc.Get(clientURL + "/health")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Start starts (or restarts, with its data) the member.
func (m *EtcdMember) Start() {
	m.t.Helper()
	cmd := exec.Command(EtcdBinary(m.t), m.args...)
	if m.host != nil {
		m.proc = StartOn(m.t, m.host, "etcd "+m.Name, cmd)
		return
	}
	m.proc = Start(m.t, "etcd "+m.Name, cmd)
}

// WaitReady waits until the member accepts client connections.
func (m *EtcdMember) WaitReady() { m.proc.WaitPort(m.t, m.Endpoint, 30*time.Second) }

// Kill kills the member with SIGKILL.
func (m *EtcdMember) Kill() { m.proc.Kill() }

// Process returns the member's running process.
func (m *EtcdMember) Process() *Process { return m.proc }
