package fencedzookeeper_test

import (
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestChrootNames opens stores with chroots ZooKeeper's path rule allows,
// which must be used. Chroots it refuses must be refused before
// connecting, naming the chroot.
func TestChrootNames(t *testing.T) {
	ens := testenv.StartZooKeeper(t)
	opentest.Names{
		What:     "chroot",
		Accepted: []string{"/fenced", "/app/locks", "/a-b.c_d", "/%C3%BC", "/a%20b"},
		URL:      func(root string) string { return ens.URL(root, "") },
		Refused: []opentest.BadName{
			{Name: "/a//b", Says: "absolute path"},
			{Name: "/a/./b", Says: `"."`},
			{Name: "/a/../b", Says: `".."`},
			{Name: "/zookeeper", Says: "reserves"},
			{Name: "/zookeeper/locks", Says: "reserves"},
			{Name: "/a%01b", Says: "ZooKeeper refuses in a path"},
			{Name: "/a%7Fb", Says: "ZooKeeper refuses in a path"},
			{Name: "/a%EF%BF%BFb", Says: "ZooKeeper refuses in a path"},
		},
		BadURL: func(root string) string { return "zk://127.0.0.1:1" + root },
	}.Check(t)
}
