package main

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// quietLogger drops go-redis's internal log lines (dial retries and the
// like): fenced reports every failure that matters as an error of its own,
// and a CLI must not interleave library chatter with its output.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(quietLogger{}) }
