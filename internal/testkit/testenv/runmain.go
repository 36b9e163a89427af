package testenv

import (
	"os"
	"testing"
)

// RunMain is the TestMain body of a package whose tests share servers.
// setup starts them on tb. Then m's tests run, tb's cleanups stop the
// servers, and the process exits with the tests' code. A setup that fails
// through tb ends the process.
func RunMain(m *testing.M, setup func(tb *MainTB)) {
	tb := NewMainTB()
	setup(tb)
	code := m.Run()
	tb.Close()
	os.Exit(code)
}
