// Package zk is a native Go client library for the ZooKeeper orchestration
// service: a copy of github.com/go-zookeeper/zk v1.0.4 (commit
// 27bc0d6c39bb4e9d3c410057bf2c779f256ba15e, BSD-3-Clause, see LICENSE),
// trimmed to what fencedzookeeper calls, with four calls added and one data
// race fixed. README.fenced.md lists every change.
package zk
