package fencedpostgres_test

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// statementCounter is a pgx tracer that counts the statements sent.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
