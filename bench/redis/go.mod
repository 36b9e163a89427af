module github.com/fenced-dev/fenced/bench/redis

go 1.26.8

replace github.com/fenced-dev/fenced => ../..

require (
	github.com/bsm/redislock v0.9.4
	github.com/fenced-dev/fenced v0.0.0
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
