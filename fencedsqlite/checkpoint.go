package fencedsqlite

import (
	"strings"

	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// checkpointStatements are the checkpoint SQL of lease table t
// (driver.Checkpointer): the write is one upsert whose SELECT reads the
// lease row, under SQLite's one write lock, so no grant can come between
// the check of the fence and the write. A row whose fence is above the
// writer's is never replaced.
func checkpointStatements(t string) *sqllease.CheckpointStatements {
	r := strings.NewReplacer("T_", t, "NOW", now)
	return &sqllease.CheckpointStatements{
		Write: sqllease.Stmt{SQL: r.Replace(`INSERT INTO T__checkpoints (key, fence, value)
SELECT key, fence, ?4 FROM T_ WHERE key = ?1 AND owner = ?2 AND fence = ?3 AND expires_ms > NOW
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence, value = excluded.value
WHERE T__checkpoints.fence <= excluded.fence`)},
		Read: sqllease.Stmt{SQL: r.Replace(`SELECT value, fence FROM T__checkpoints WHERE key = ?1`)},
	}
}

// checkpointsShape is the checkpoint table's, as pragma_table_info reports
// it.
var checkpointsShape = leasetable.Shape{
	Columns: []leasetable.Column{
		{Name: "key", Type: "text", Identity: true},
		{Name: "fence", Type: "integer"},
		{Name: "value", Type: "blob"},
	},
	Key: "key",
}

// createCheckpoints creates the checkpoint table of lease table t.
func createCheckpoints(t string) string {
	return `CREATE TABLE ` + t + sqllease.CheckpointsSuffix + ` (
  key TEXT PRIMARY KEY NOT NULL,
  fence INTEGER NOT NULL CHECK (fence > 0),
  value BLOB NOT NULL
) WITHOUT ROWID`
}
