package zk

// Test helpers: fenced's stand-in for upstream's server_help_test.go and
// server_java_test.go. The tests run against a real ZooKeeper server that
// internal/testkit/testenv starts once for the package.

import (
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// ens is the standalone server every test of the package shares.
var ens *testenv.ZKEnsemble

func TestMain(m *testing.M) {
	testenv.RunMain(m, func(tb *testenv.MainTB) {
		ens = testenv.StartZooKeeper(tb)
	})
}

// connect opens a session on the shared server, closed when the test ends.
// It returns before the session is established: requests wait for it.
func connect(t *testing.T, options ...connOption) (*Conn, <-chan Event) {
	t.Helper()
	return connectFor(t, 15*time.Second, options...)
}

// connectFor is connect with the session timeout asked for.
func connectFor(t *testing.T, session time.Duration, options ...connOption) (*Conn, <-chan Event) {
	t.Helper()
	c, events, err := Connect(ens.Servers(), session, append([]connOption{WithLogInfo(false)}, options...)...)
	if err != nil {
		t.Fatalf("Connect returned error: %+v", err)
	}
	t.Cleanup(c.Close)
	return c, events
}

// withHostProvider sets the connection's HostProvider (upstream's
// WithHostProvider, which fenced does not call).
func withHostProvider(hp HostProvider) connOption {
	return func(c *Conn) { c.hostProvider = hp }
}

// withReconnectLatch makes the connection wait, after it lost its link,
// until latch is closed before it dials again.
func withReconnectLatch(latch chan struct{}) connOption {
	return func(c *Conn) { c.reconnectLatch = latch }
}

// links records the network connections a Conn dials, so that a test can
// cut its link to the server as a network fault would.
type links struct {
	mu    sync.Mutex
	conns []net.Conn
}

// option returns the connection option that dials through l.
func (l *links) option() connOption {
	return WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
		nc, err := net.DialTimeout(network, addr, timeout)
		if err == nil {
			l.mu.Lock()
			l.conns = append(l.conns, nc)
			l.mu.Unlock()
		}
		return nc, err
	})
}

// dials returns how many connections were dialed.
func (l *links) dials() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// cut closes the latest connection.
func (l *links) cut(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) == 0 {
		t.Fatal("no connection to cut")
	}
	l.conns[len(l.conns)-1].Close()
}

// pauseServer stops the shared server's process (SIGSTOP): its sockets stay
// open and it answers nothing until the returned function resumes it
// (also run when the test ends).
func pauseServer(t *testing.T) (resume func()) {
	t.Helper()
	p := ens.Nodes[0].Process()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

// requireNoErrorf is upstream's helper of that name.
func requireNoErrorf(t *testing.T, err error, msgAndArgs ...interface{}) {
	t.Helper()

	if err != nil {
		t.Logf("received unexpected error: %v", err)
		t.Fatal(msgAndArgs...)
	}
}
