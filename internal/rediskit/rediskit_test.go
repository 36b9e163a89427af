package rediskit

import (
	"testing"
	"time"
)

// TestHashSlot checks HashSlot against slots Redis Cluster documents and
// computes (CLUSTER KEYSLOT).
func TestHashSlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		slot uint16
	}{
		{"123456789", 0x31C3 % 16384}, // the CRC16/XMODEM check value
		{"foo", 12182},
		{"somekey", 11058},
		{"foo{hash_tag}", 2515},
		{"bar{hash_tag}", 2515},
		{"{}foo", HashSlot("{}foo")}, // an empty tag hashes the whole key
		{"fenced:{job:7}:lock", HashSlot("job:7")},
		{"fenced:{job:7}:fence", HashSlot("job:7")},
	} {
		if got := HashSlot(c.key); got != c.slot {
			t.Errorf("HashSlot(%q) = %d, want %d", c.key, got, c.slot)
		}
	}
	if HashSlot("{}foo") == HashSlot("foo") {
		t.Errorf("an empty hash tag was taken as a tag")
	}
}

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

func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		prefix, key string
		want        Keys
	}{
		{"fenced:", "job", Keys{Lock: "fenced:{job}:lock", Fence: "fenced:{job}:fence", Audit: "fenced:{job}:breaks", Channel: "fenced:{job}:free", Waiters: "fenced:{job}:waitq", Claim: "fenced:{job}:claim"}},
		{"", "a{b}c", Keys{Lock: "{a{b}c}:lock", Fence: "{a{b}c}:fence", Audit: "{a{b}c}:breaks", Channel: "{a{b}c}:free", Waiters: "{a{b}c}:waitq", Claim: "{a{b}c}:claim"}},
	} {
		l := Layout{Prefix: tc.prefix}
		if got := l.Keys(tc.key); got != tc.want {
			t.Errorf("Keys(%q) under %q = %+v, want %+v", tc.key, tc.prefix, got, tc.want)
		}
		if got := l.Lock(tc.key); got != tc.want.Lock {
			t.Errorf("Lock(%q) under %q = %q, want %q", tc.key, tc.prefix, got, tc.want.Lock)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = Layout{Prefix: "fenced:"}.Keys("invoice:inv_72") }); n > 1 {
		t.Errorf("Keys allocates %v times, want 1", n)
	}
}

func TestValue(t *testing.T) {
	for _, tc := range []struct {
		fence uint64
		owner string
	}{{1, "o"}, {0, ""}, {18446744073709551615, "0123456789abcdef0123456789abcdef"}} {
		v := Value(tc.fence, tc.owner)
		f, o, ok := ParseValue(v)
		if !ok || f != tc.fence || o != tc.owner {
			t.Errorf("Value(%d, %q) = %q, parsed back as %d, %q, %v", tc.fence, tc.owner, v, f, o, ok)
		}
	}
	if v := Value(72, "abc"); v != "72:abc" {
		t.Errorf("Value(72, abc) = %q", v)
	}
}
