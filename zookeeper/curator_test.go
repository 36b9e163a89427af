package zookeeper_test

import (
	"testing"

	"github.com/fenced-dev/fenced/internal/testenv"
)

func testCurator(t *testing.T, zk *testenv.ZKEnsemble) {}
