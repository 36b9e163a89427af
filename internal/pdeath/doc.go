// Package pdeath starts commands whose parent-death signal (Pdeathsig)
// follows this process, not the thread that happened to fork them. It
// has content on Linux only, the one system with Pdeathsig.
package pdeath
