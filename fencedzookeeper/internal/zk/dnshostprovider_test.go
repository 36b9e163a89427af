package zk

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"
)

type lookupHostOption struct {
	lookupFn lookupHostFn
}

func withLookupHost(lookupFn lookupHostFn) DNSHostProviderOption {
	return lookupHostOption{
		lookupFn: lookupFn,
	}
}

func (o lookupHostOption) apply(provider *DNSHostProvider) {
	provider.lookupHost = o.lookupFn
}

// TestDNSHostProviderCreate is just like TestCreate, but with an
// overridden HostProvider that ignores the provided hostname.
// It sets the provider with withHostProvider (main_test.go), where
// upstream calls WithHostProvider.
func TestIntegration_DNSHostProviderCreate(t *testing.T) {
	_, port, err := net.SplitHostPort(ens.Servers()[0])
	if err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("foo.example.com:%s", port)
	hostProvider := NewDNSHostProvider(
		withLookupHost(func(ctx context.Context, host string) ([]string, error) {
			if _, ok := ctx.Deadline(); !ok {
				t.Fatal("No lookup context deadline set")
			}
			return []string{"127.0.0.1"}, nil
		}),
	)

	zk, _, err := Connect([]string{server}, time.Second*15, withHostProvider(hostProvider), WithLogInfo(false))
	if err != nil {
		t.Fatalf("Connect returned error: %+v", err)
	}
	defer zk.Close()

	path := "/gozk-test-dns"

	if err := zk.Delete(path, -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}
	if p, err := zk.Create(path, []byte{1, 2, 3, 4}, 0, WorldACL(PermAll)); err != nil {
		t.Fatalf("Create returned error: %+v", err)
	} else if p != path {
		t.Fatalf("Create returned different path '%s' != '%s'", p, path)
	}
	if data, stat, err := zk.Get(path); err != nil {
		t.Fatalf("Get returned error: %+v", err)
	} else if stat == nil {
		t.Fatal("Get returned nil stat")
	} else if len(data) < 4 {
		t.Fatal("Get returned wrong size data")
	}
}

// TestDNSHostProviderRetryStart tests the `retryStart` functionality
// of DNSHostProvider.
// It's also probably the clearest visual explanation of exactly how
// it works.
func TestDNSHostProviderRetryStart(t *testing.T) {
	t.Parallel()

	hp := NewDNSHostProvider(
		withLookupHost(func(_ context.Context, host string) ([]string, error) {
			return []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}, nil
		}),
	)

	if err := hp.Init([]string{"foo.example.com:12345"}); err != nil {
		t.Fatal(err)
	}

	testdata := []struct {
		retryStartWant bool
		callConnected  bool
	}{
		// Repeated failures.
		{false, false},
		{false, false},
		{false, false},
		{true, false},
		{false, false},
		{false, false},
		{true, true},

		// One success offsets things.
		{false, false},
		{false, true},
		{false, true},

		// Repeated successes.
		{false, true},
		{false, true},
		{false, true},
		{false, true},
		{false, true},

		// And some more failures.
		{false, false},
		{false, false},
		{true, false}, // Looped back to last known good server: all alternates failed.
		{false, false},
	}

	for i, td := range testdata {
		_, retryStartGot := hp.Next()
		if retryStartGot != td.retryStartWant {
			t.Errorf("%d: retryStart=%v; want %v", i, retryStartGot, td.retryStartWant)
		}
		if td.callConnected {
			hp.Connected()
		}
	}
}
