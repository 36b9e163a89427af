//go:build linux

package pdeath

import (
	"os/exec"
	"runtime"
)

// Launcher starts commands from one OS thread that lives until Close. It is
// for commands that set Pdeathsig but are waited for by the caller (unlike
// a Group). The kernel sends Pdeathsig when the thread that forked the
// child exits, not when the process does. A Go program's threads come and
// go: the runtime ends a thread whose goroutine exits while locked to it.
// So calling cmd.Start from an arbitrary goroutine can kill the child at a
// random moment, or fail to kill it when intended. A Launcher forks every
// command from a goroutine locked to its thread, which stays alive until
// Close. The process's death still ends the thread and so sends Pdeathsig.
type Launcher struct {
	reqs chan launch
	done chan struct{}
}

type launch struct {
	cmd *exec.Cmd
	err chan error
}

// NewLauncher starts a Launcher's thread.
func NewLauncher() *Launcher {
	l := &Launcher{reqs: make(chan launch), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with Close
		for {
			select {
			case r := <-l.reqs:
				r.err <- r.cmd.Start()
			case <-l.done:
				return
			}
		}
	}()
	return l
}

// Start starts cmd from the Launcher's thread, as cmd.Start would.
func (l *Launcher) Start(cmd *exec.Cmd) error {
	r := launch{cmd: cmd, err: make(chan error, 1)}
	l.reqs <- r
	return <-r.err
}

// Close ends the Launcher's thread: commands it started that still run get
// their Pdeathsig now. Start must not be called after Close.
func (l *Launcher) Close() { close(l.done) }
