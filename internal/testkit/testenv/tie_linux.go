//go:build linux

package testenv

import (
	"os/exec"
	"sync"
	"syscall"

	"github.com/fenced-dev/fenced/internal/pdeath"
)

// serverLauncher forks every server from one thread that lives as long
// as this process, so that a server's Pdeathsig fires when it ends.
var serverLauncher = sync.OnceValue(pdeath.NewLauncher)

// startTied starts cmd so that the kernel kills it when this process
// dies. A test binary that panics or is killed runs no t.Cleanup; its
// servers would otherwise run on, holding ports, memory and CPU.
func startTied(cmd *exec.Cmd) error {
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return serverLauncher().Start(cmd)
}
