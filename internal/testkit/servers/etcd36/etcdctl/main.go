// Command etcdctl is etcd v3.6.17's command-line client, built beside the
// server of the same version for the interop tests.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() { ctlv3.MustStart() }
