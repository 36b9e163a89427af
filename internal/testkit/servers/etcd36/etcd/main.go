// Command etcd is etcd v3.6.17's server, built from the Go module proxy for
// the tests that run fenced against a current etcd (scripts/test.sh builds
// it into a cache directory outside the repository).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
