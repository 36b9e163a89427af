package leasetable

// ColumnTypes are one database's catalog types (as it reports them, lower
// case) for the columns of the three tables of a SQL lease store. The
// column names are the same in every store built on them (PostgreSQL,
// MySQL/MariaDB). The lease table has lease_key, owner, fence, expires_at.
// The audit table (BreakColumns) has id, broken_at, lease_key, fence,
// owner, reason, broken_by. The floor table has id, fence_floor. SQLite's
// tables keep the names of its first release (key, expires_ms, ...), so
// that existing lease files open unchanged.
type ColumnTypes struct {
	// Key and Owner are the lease table's identity columns, with the
	// bytes they must hold where the database bounds them (0: no bound).
	Key, Owner           string
	KeyBytes, OwnerBytes int64
	// Fence is the fence counter's type, Time the type of expires_at and
	// broken_at.
	Fence, Time string
	// AuditID is the audit table's id column; AuditIDAuto says the
	// database numbers it through AUTO_INCREMENT.
	AuditID     string
	AuditIDAuto bool
	// AuditOwner is the audit table's (shortened) owner column, AuditText
	// that of reason and broken_by.
	AuditOwner, AuditText string
	// FloorID is the floor table's id column.
	FloorID string
}

// Shapes returns the shapes of the lease, audit and floor tables.
func (c ColumnTypes) Shapes() (lease, breaks, floor Shape) {
	key := Column{Name: "lease_key", Type: c.Key, Identity: true, MinBytes: c.KeyBytes}
	lease = Shape{
		Columns: []Column{key, {Name: "owner", Type: c.Owner, Identity: true, MinBytes: c.OwnerBytes},
			{Name: "fence", Type: c.Fence}, {Name: "expires_at", Type: c.Time}},
		Key: key.Name,
	}
	breaks = Shape{Columns: []Column{{Name: "id", Type: c.AuditID}, {Name: "broken_at", Type: c.Time}, key,
		{Name: "fence", Type: c.Fence}, {Name: "owner", Type: c.AuditOwner},
		{Name: "reason", Type: c.AuditText}, {Name: "broken_by", Type: c.AuditText}}}
	if c.AuditIDAuto {
		breaks.AutoIncrement = []string{"id"}
	}
	floor = Shape{Columns: []Column{{Name: "id", Type: c.FloorID}, {Name: "fence_floor", Type: c.Fence}}, Key: "id"}
	return lease, breaks, floor
}
