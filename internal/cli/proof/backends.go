package proof

// Every backend, so a worker can open any store URL.
import (
	_ "github.com/fenced-dev/fenced/fenceddynamodb"
	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedmysql"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedredis"
	_ "github.com/fenced-dev/fenced/fencedredlock"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/fencedzookeeper"
)
