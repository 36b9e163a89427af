package ttlrule

import (
	"testing"
	"time"
)

func TestUnitsRoundsUp(t *testing.T) {
	for _, c := range []struct {
		ttl, unit time.Duration
		want      int64
	}{
		{0, time.Millisecond, 0},
		{-time.Second, time.Millisecond, 0},
		{time.Nanosecond, time.Millisecond, 1},
		{999 * time.Microsecond, time.Millisecond, 1},
		{time.Millisecond, time.Millisecond, 1},
		{1500 * time.Microsecond, time.Millisecond, 2},
		{1500 * time.Microsecond, time.Microsecond, 1500},
		{1500*time.Microsecond + 1, time.Microsecond, 1501},
		{time.Second + time.Millisecond, time.Second, 2},
		{time.Second, 0, int64(time.Second)},
	} {
		if got := Units(c.ttl, c.unit); got != c.want {
			t.Errorf("Units(%v, %v) = %d, want %d", c.ttl, c.unit, got, c.want)
		}
	}
}
