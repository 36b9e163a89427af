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
		{"fenced:", "job", Keys{Lock: "fenced:{job}:lock", Fence: "fenced:{job}:fence", Audit: "fenced:{job}:breaks", Channel: "fenced:{job}:free", Waiters: "fenced:{job}:waitq", Claim: "fenced:{job}:claim",
			Observed: "fenced:{job}:observed"}},
		{"", "a{b}c", Keys{Lock: "{a{b}c}:lock", Fence: "{a{b}c}:fence", Audit: "{a{b}c}:breaks", Channel: "{a{b}c}:free", Waiters: "{a{b}c}:waitq", Claim: "{a{b}c}:claim",
			Observed: "{a{b}c}:observed"}},
	} {
		l := Layout{Prefix: tc.prefix}
		if got := l.Keys(tc.key); got != tc.want {
			t.Errorf("Keys(%q) under %q = %+v, want %+v", tc.key, tc.prefix, got, tc.want)
		}
		if got := l.Lock(tc.key); got != tc.want.Lock {
			t.Errorf("Lock(%q) under %q = %q, want %q", tc.key, tc.prefix, got, tc.want.Lock)
		}
	}
	// A key starting with '}': a Cluster layout writes a space before it,
	// elsewhere its names stay as they always were.
	if got := (Layout{Prefix: "p:", Cluster: true}).Keys("}a").Lock; got != "p:{ }a}:lock" {
		t.Errorf("Cluster Keys(}a).Lock = %q, want p:{ }a}:lock", got)
	}
	if got := (Layout{Prefix: "p:"}).Keys("}a").Lock; got != "p:{}a}:lock" {
		t.Errorf("standalone Keys(}a).Lock = %q, want p:{}a}:lock (unchanged)", got)
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

// TestKeysShareOneSlot checks that every name of a lease key hashes to one
// Cluster slot under a Cluster layout, whatever braces the key holds, and
// that the lock and audit names map back to the key (also through the
// SCAN pattern of a prefix). TestClusterKeysWithBraces in fencedredis
// checks HashSlot against a real server's CLUSTER KEYSLOT.
func TestKeysShareOneSlot(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		l := Layout{Prefix: "fenced:", Cluster: cluster}
		for _, key := range []string{"job", "}a", "{}x", "a{b}c", "{{a}}", "}", "}}x", "a}", "{", "x{", "}{a}"} {
			k := l.Keys(key)
			if cluster {
				slot := HashSlot(k.Lock)
				for _, name := range []string{k.Fence, k.Audit, k.Waiters, k.Claim} {
					if HashSlot(name) != slot {
						t.Errorf("key %q: %s in slot %d, %s in %d", key, k.Lock, slot, name, HashSlot(name))
					}
				}
			}
			if got, ok := l.KeyOfLock(k.Lock); !ok || got != key {
				t.Errorf("cluster %v: KeyOfLock(%q) = %q, %v; want %q", cluster, k.Lock, got, ok, key)
			}
			if got, ok := l.KeyOfAudit(k.Audit); !ok || got != key {
				t.Errorf("cluster %v: KeyOfAudit(%q) = %q, %v; want %q", cluster, k.Audit, got, ok, key)
			}
			if p := l.LockPattern(key); !globMatches(p, k.Lock) {
				t.Errorf("cluster %v: LockPattern(%q) = %q does not match %q", cluster, key, p, k.Lock)
			}
		}
	}
}

// globMatches matches name against a pattern of LockPattern's form: an
// escaped literal, '*', an escaped literal.
func globMatches(pattern, name string) bool {
	unescape := func(s string) string {
		var b []byte
		for i := 0; i < len(s); i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			b = append(b, s[i])
		}
		return string(b)
	}
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == '\\' {
			i++
			continue
		}
		if pattern[i] == '*' {
			pre, post := unescape(pattern[:i]), unescape(pattern[i+1:])
			return len(name) >= len(pre)+len(post) && name[:len(pre)] == pre && name[len(name)-len(post):] == post
		}
	}
	return unescape(pattern) == name
}
