package fencedredis_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
	"github.com/redis/go-redis/v9"
)

// newDriver opens a driver on srv over a fresh go-redis client, as another
// process would, closing both when the test ends.
func newDriver(t testing.TB, srv *testenv.Redis, opts *fencedredis.Options) *fencedredis.Driver {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Config.Password, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	d, err := fencedredis.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{Password: "s3cret"})
	h := drivertest.Harness{
		Open:     func(t *testing.T) driver.Driver { return newDriver(t, srv, nil) },
		MinFence: fenced.FenceRepeatable,
		ShortTTL: 300 * time.Millisecond,
		BadURLs: []string{
			"redis://",
			"redis:///0",
			"redis://127.0.0.1:notaport/0",
			"redis://127.0.0.1:70000/0",
			"redis://127.0.0.1:6379/notadb",
			"redis://127.0.0.1:6379/0?nosuchoption=1",
			"redis://127.0.0.1:6379/0?wait_replicas=-1",
			"redis://127.0.0.1:6379/0?wait_timeout=soon",
			"redis://127.0.0.1:6379/0?pipeline=maybe",
			"redis://127.0.0.1:6379/0?prefix=a;b",
			"redis://127.0.0.1:6379/0?prefix=a&prefix=b",
			"redis://127.0.0.1:6379/0?dial_timeout=1s;x",
			"rediss://",
		},
	}
	drivertest.RunConformanceTests(t, h)
	recipetest.RunConformanceTests(t, h)
}

func owner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
