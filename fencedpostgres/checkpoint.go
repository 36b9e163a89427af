package fencedpostgres

import (
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// checkpointStatements are the checkpoint SQL of lease table table
// (driver.Checkpointer). The write is one INSERT ... SELECT ... FOR SHARE:
// the share lock on the lease row makes a concurrent grant (an UPDATE of
// that row) wait for the write's commit, and a grant committed first makes
// PostgreSQL evaluate the condition again on the row it committed, which
// then no longer has the writer's owner and fence; so a grant and a
// checkpoint are ordered, and a checkpoint is stored only under the
// current grant. A row whose fence is above the writer's is never
// replaced.
func checkpointStatements(table string) *sqllease.CheckpointStatements {
	t, c := quoteIdent(table), quoteIdent(table+sqllease.CheckpointsSuffix)
	return &sqllease.CheckpointStatements{
		Write: sqllease.Stmt{SQL: `INSERT INTO ` + c + ` AS c (lease_key, fence, value)
SELECT lease_key, fence, $4::bytea FROM ` + t + `
 WHERE lease_key = $1 AND owner = $2 AND fence = $3 AND expires_at > now()
   FOR SHARE
ON CONFLICT (lease_key) DO UPDATE SET fence = excluded.fence, value = excluded.value
 WHERE c.fence <= excluded.fence`},
		Read: sqllease.Stmt{SQL: `SELECT value, fence FROM ` + c + ` WHERE lease_key = $1`},
	}
}

// checkpointsShape is the checkpoint table's, as pg_catalog reports it.
var checkpointsShape = leasetable.Shape{
	Columns: []leasetable.Column{
		{Name: "lease_key", Type: "text", Identity: true},
		{Name: "fence", Type: "bigint"},
		{Name: "value", Type: "bytea"},
	},
	Key: "lease_key",
}

// createCheckpoints creates the checkpoint table of lease table table.
func createCheckpoints(table string) string {
	return `CREATE TABLE ` + quoteIdent(table+sqllease.CheckpointsSuffix) + ` (
  lease_key text COLLATE "C" PRIMARY KEY,
  fence     bigint NOT NULL CHECK (fence > 0),
  value     bytea NOT NULL
)`
}
