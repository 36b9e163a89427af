// Package electproof holds the elector row of fenced's generative proof:
// client-go's leaderelection.RunOrDie over a fencedk8s.ResourceLock, run
// by proof.RunGenElect and judged by proof.CheckGenElect. The row lives in
// fencedk8s's module because the core module does not require client-go;
// see genelect_test.go. It has no code of its own.
package electproof
