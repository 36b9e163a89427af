package proof

// Every backend, so a worker can open any store URL.
import (
	_ "github.com/fenced-dev/fenced/dynamodb"
	_ "github.com/fenced-dev/fenced/etcd"
	_ "github.com/fenced-dev/fenced/mysql"
	_ "github.com/fenced-dev/fenced/postgres"
	_ "github.com/fenced-dev/fenced/redis"
	_ "github.com/fenced-dev/fenced/redlock"
	_ "github.com/fenced-dev/fenced/sqlite"
	_ "github.com/fenced-dev/fenced/zookeeper"
)
