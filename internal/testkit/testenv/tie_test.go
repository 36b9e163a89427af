//go:build linux

package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const tieChildEnv = "FENCED_TESTENV_TIE_CHILD"

// TestServersDieWithTheTestProcess panics in a goroutine of a child test
// process that started a server (as a driver's goroutine might): no
// cleanup runs then, and the server must die anyway.
func TestServersDieWithTheTestProcess(t *testing.T) {
	if os.Getenv(tieChildEnv) != "" {
		p := Start(t, "sleeper", exec.Command("sleep", "300"))
		fmt.Printf("pid %d\n", p.Cmd.Process.Pid)
		go panic("the test process dies without its cleanups")
		select {}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersDieWithTheTestProcess$")
	cmd.Env = append(os.Environ(), tieChildEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil {
		t.Fatalf("the child test process did not panic:\n%s", out.String())
	}
	_, after, ok := strings.Cut(out.String(), "pid ")
	if !ok {
		t.Fatalf("the child test process started no server:\n%s", out.String())
	}
	pid, err := strconv.Atoi(strings.Fields(after)[0])
	if err != nil {
		t.Fatalf("bad pid in %q: %v", out.String(), err)
	}
	// The kernel sends SIGKILL as the child exits; the bound only allows
	// a busy machine to schedule the dying process.
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = exec.Command("kill", "-9", strconv.Itoa(pid)).Run()
			t.Fatalf("the server (pid %d) still ran 10s after its test process died", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid runs: it exists and is not a zombie.
func alive(pid int) bool {
	st, _, ok := procStat(fmt.Sprintf("/proc/%d/stat", pid))
	return ok && st != 'Z' && st != 'X'
}
