package fencedzookeeper_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// curatorClasspath is Debian's Curator (libcurator-recipes-java) with its
// dependencies, which the jars' manifests name.
const curatorClasspath = "/usr/share/java/curator-recipes.jar:/usr/share/java/curator-framework.jar:/usr/share/java/curator-client.jar:" + testenv.ZooKeeperJars

// curatorMain drives one InterProcessMutex from stdin commands:
// "acquire MS" answers HELD or TIMEOUT, "release" answers RELEASED.
const curatorMain = `
import org.apache.curator.framework.*;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;
import java.io.*;
import java.util.concurrent.TimeUnit;

public class CuratorLock {
  public static void main(String[] args) throws Exception {
    CuratorFramework c = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
    c.start();
    c.blockUntilConnected();
    InterProcessMutex m = new InterProcessMutex(c, args[1]);
    System.out.println("READY");
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null; ) {
      String[] f = line.trim().split(" ");
      if (f[0].equals("acquire")) {
        System.out.println(m.acquire(Long.parseLong(f[1]), TimeUnit.MILLISECONDS) ? "HELD" : "TIMEOUT");
      } else if (f[0].equals("release")) {
        m.release();
        System.out.println("RELEASED");
      }
    }
    c.close();
  }
}
`

type curator struct {
	stdin io.WriteCloser
	lines chan string
}

func (c *curator) do(t *testing.T, cmd string, timeout time.Duration) string {
	t.Helper()
	if cmd != "" {
		fmt.Fprintln(c.stdin, cmd)
	}
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatal("Curator process exited")
		}
		return l
	case <-time.After(timeout):
		t.Fatalf("Curator did not answer %q within %v", cmd, timeout)
	}
	return ""
}

// startCurator compiles and starts the Curator program on lockPath.
func startCurator(t *testing.T, zk *testenv.ZKEnsemble, lockPath string) *curator {
	t.Helper()
	javac := testenv.RequireBinary(t, "default-jdk-headless", "javac")
	if _, err := os.Stat("/usr/share/java/curator-recipes.jar"); err != nil {
		t.Fatal("Curator not found; install the Debian package libcurator-recipes-java")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "CuratorLock.java"), []byte(curatorMain), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(javac, "-cp", curatorClasspath, "-d", dir, filepath.Join(dir, "CuratorLock.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	cmd := exec.Command("java", "-XX:TieredStopAtLevel=1", "-cp", curatorClasspath+":"+dir, "CuratorLock", strings.Join(zk.Servers(), ","), lockPath)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.SafeBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &curator{stdin: stdin, lines: make(chan string, 10)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("Curator stderr:\n%s", stderr.String())
		}
	})
	if l := c.do(t, "", 60*time.Second); l != "READY" {
		t.Fatalf("Curator said %q", l)
	}
	return c
}

// testCurator proves that Curator's InterProcessMutex and fenced exclude
// each other on the same lock path, in both directions.
func testCurator(t *testing.T, zk *testenv.ZKEnsemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := fenced.Open(ctx, zk.URL("/interop", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	key := "invoice:inv_72"
	lockPath := rootaccess.Driver(client).(*fencedzookeeper.Driver).LockPath(key)
	if lockPath != "/interop/invoice:inv_72" {
		t.Fatalf("lock path %q", lockPath)
	}
	cur := startCurator(t, zk, lockPath)

	// Curator holds: fenced is refused, then waits, and gets the lock when
	// Curator releases.
	if l := cur.do(t, "acquire 10000", 30*time.Second); l != "HELD" {
		t.Fatalf("Curator acquire: %s", l)
	}
	if _, err := client.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: 5 * time.Second}); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("fenced TryAcquire while Curator holds: %v, want ErrHeld", err)
	}
	info, err := client.Inspect(ctx, key)
	if err != nil || !info.Held {
		t.Fatalf("Inspect while Curator holds: %+v, %v", info, err)
	}
	got := make(chan *fenced.Lease, 1)
	go func() {
		l, err := client.Acquire(ctx, key, &fenced.LeaseOptions{TTL: 5 * time.Second, MaxWait: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-got:
		t.Fatal("fenced acquired while Curator held the lock")
	case <-time.After(time.Second):
	}
	if l := cur.do(t, "release", 10*time.Second); l != "RELEASED" {
		t.Fatalf("Curator release: %s", l)
	}
	var l *fenced.Lease
	select {
	case l = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("fenced waiter not served after Curator released")
	}
	if l == nil {
		return
	}
	if l.Fence() <= info.Fence {
		t.Fatalf("fenced fence %d not above Curator's hold %d", l.Fence(), info.Fence)
	}

	// fenced holds: Curator times out, then gets the lock after release.
	if r := cur.do(t, "acquire 1000", 30*time.Second); r != "TIMEOUT" {
		t.Fatalf("Curator acquire while fenced holds: %s, want TIMEOUT", r)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := cur.do(t, "acquire 10000", 30*time.Second); r != "HELD" {
		t.Fatalf("Curator acquire after fenced released: %s", r)
	}
	info, err = client.Inspect(ctx, key)
	if err != nil || !info.Held || info.Fence <= l.Fence() {
		t.Fatalf("Inspect with Curator holding again: %+v, %v; want a fence above %d", info, err, l.Fence())
	}
	cur.do(t, "release", 10*time.Second)
}
