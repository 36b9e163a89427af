// Package childproc lets a test binary run copies of itself as worker
// processes.
//
// The parent starts children in a named mode. A child opens the store the
// parent named and appends lines to the parent's output file. The parent
// reads the lines back and judges them. A test file keeps only its modes
// and its judgement.
package childproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// The environment a child reads.
const (
	modeEnv  = "FENCED_TEST_CHILD"
	storeEnv = "STORE"
	outEnv   = "OUT"
)

// Main is a test binary's TestMain body. With no mode in the environment
// it runs m's tests; otherwise it runs the named mode. It exits with the
// tests' or the mode's code; an unknown mode exits 2.
func Main(m *testing.M, modes map[string]func() int) {
	mode := os.Getenv(modeEnv)
	if mode == "" {
		os.Exit(m.Run())
	}
	run, ok := modes[mode]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown child mode %q\n", mode)
		os.Exit(2)
	}
	os.Exit(run())
}

// Command returns the test binary, run in mode with no tests, and with
// env (KEY=value) added to the parent's environment.
func Command(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), modeEnv+"="+mode), env...)
	return cmd
}

// Start starts n children in mode on the store at URL store, appending to
// the file out. env is added to their environment. Child i is named
// "<mode> i"; each is killed when the test ends.
func Start(t testing.TB, mode string, n int, store, out string, env ...string) []*testenv.Process {
	t.Helper()
	var procs []*testenv.Process
	for i := range n {
		cmd := Command(mode, append([]string{storeEnv + "=" + store, outEnv + "=" + out}, env...)...)
		procs = append(procs, testenv.Start(t, fmt.Sprintf("%s %d", mode, i), cmd))
	}
	return procs
}

// Store opens, in a child, a client on the parent's store.
func Store(ctx context.Context) (*fenced.Client, error) {
	return fenced.Open(ctx, os.Getenv(storeEnv), nil)
}

// Output opens, in a child, the parent's output file for appending. A
// short line written in one call does not interleave with other
// children's lines.
func Output() (*os.File, error) {
	return os.OpenFile(os.Getenv(outEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
}

// Fail prints err for the parent's log and returns 1, a failed child's
// exit code.
func Fail(err error) int {
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// Lines returns the lines of the file out, each split into fields. Blank
// lines are skipped. A file no child has made yet has no lines.
func Lines(t testing.TB, out string) [][]string {
	t.Helper()
	data, err := os.ReadFile(out)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var lines [][]string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			lines = append(lines, f)
		}
	}
	return lines
}
