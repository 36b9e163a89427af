package rediskit

import (
	"testing"
	"time"
)

// TestMillis checks that a TTL reaches Redis rounded up to the
// millisecond, never shortened (PX and PEXPIRE count whole milliseconds).
func TestMillis(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{1500 * time.Microsecond, 2},
		{time.Second + time.Nanosecond, 1001},
		{30 * time.Second, 30000},
	} {
		if got := Millis(c.ttl); got != c.want {
			t.Errorf("Millis(%v) = %d, want %d", c.ttl, got, c.want)
		}
	}
}
