//go:build !linux

package testenv

import "os/exec"

// startTied starts cmd. Outside Linux nothing ties it to this process.
func startTied(cmd *exec.Cmd) error { return cmd.Start() }
