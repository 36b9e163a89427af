package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestRunInteropsWithEtcdctlLock checks, through the CLI only, that
// `fenced run` and `etcdctl lock` exclude each other on one lock name in
// both directions, and that `fenced inspect` reports etcdctl's holder with
// the revision etcdctl gives its child as ETCD_LOCK_REV.
func TestRunInteropsWithEtcdctlLock(t *testing.T) {
	etcdctl := testenv.RequireBinary(t, "etcd-client", "etcdctl")
	cluster := testenv.StartEtcd(t)
	store := cluster.URL("prefix=locks/")
	endpoints := "--endpoints=" + strings.Join(cluster.Endpoints(), ",")

	// etcdctl holds locks/job: fenced run is refused, and fenced inspect
	// shows the holder's revision as the fence.
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := exec.Command(etcdctl, endpoints, "lock", "--ttl=10", "locks/job", "--",
		"sh", "-c", `echo "REV=$ETCD_LOCK_REV"; while [ -e "$HOLD" ]; do sleep 0.05; done`)
	ctl.Env = append(os.Environ(), "ETCDCTL_API=3", "HOLD="+hold)
	out, err := ctl.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.Remove(hold)
		ctl.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("etcdctl lock: %v", err)
	}
	rev, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(line), "REV="), 10, 64)
	if err != nil {
		t.Fatalf("etcdctl printed %q", line)
	}
	if r := cli(t, store, "run", "job", "--", "echo", "RAN"); r.code != 75 || strings.Contains(r.stdout, "RAN") {
		t.Fatalf("fenced run while etcdctl holds: exit %d, stdout %q; want 75, nothing run", r.code, r.stdout)
	}
	r := cli(t, store, "inspect", "job", "-o", "json")
	var info leaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || !info.Held || info.Fence != rev {
		t.Fatalf("fenced inspect while etcdctl holds: %q (%v); want held with fence %d = ETCD_LOCK_REV", r.stdout, err, rev)
	}
	os.Remove(hold)
	if err := ctl.Wait(); err != nil {
		t.Fatalf("etcdctl lock: %v", err)
	}

	// fenced holds: an etcdctl lock started by fenced's own child cannot
	// get the lock while fenced holds it (timeout ends it), and gets it
	// right after.
	t.Setenv("ETCDCTL", etcdctl)
	t.Setenv("ENDPOINTS", endpoints)
	t.Setenv("ETCDCTL_API", "3")
	start := time.Now()
	r = cli(t, store, "run", "--ttl", "10s", "job", "--", "sh", "-c",
		`timeout 2 "$ETCDCTL" "$ENDPOINTS" lock locks/job echo INSIDE; echo "etcdctl exit $?"`)
	if r.code != 0 || strings.Contains(r.stdout, "INSIDE") || !strings.Contains(r.stdout, "etcdctl exit 124") {
		t.Fatalf("etcdctl lock under fenced run: exit %d, stdout %q; want etcdctl timed out (124) without the lock", r.code, r.stdout)
	}
	if time.Since(start) < 2*time.Second {
		t.Fatal("etcdctl gave up before its timeout")
	}
	after := exec.Command(etcdctl, endpoints, "lock", "locks/job", "echo", "INSIDE")
	after.Env = append(os.Environ(), "ETCDCTL_API=3")
	if got, err := after.Output(); err != nil || !strings.Contains(string(got), "INSIDE") {
		t.Fatalf("etcdctl lock after fenced released: %q, %v", got, err)
	}
}
