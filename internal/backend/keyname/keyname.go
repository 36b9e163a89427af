// Package keyname maps fenced keys to one path component of a hierarchical
// store (an etcd lock name, a ZooKeeper znode name) and back.
package keyname

import (
	"net/url"
	"strings"
)

// Escape maps key to a string without '/'. '%' and '/' are percent-escaped.
// The keys "." and ".." (invalid znode names) become "%2E" and "%2E%2E".
// The mapping is a prefix code on keys other than those two, so a key
// prefix maps to a name prefix.
func Escape(key string) string {
	switch key {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return EscapePrefix(key)
}

// EscapePrefix escapes a key prefix for a prefix match on escaped names.
// Every key that starts with prefix has an escaped name that starts with
// EscapePrefix(prefix). The keys "." and ".." are the exception.
func EscapePrefix(key string) string {
	if !strings.ContainsAny(key, "%/") {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Unescape reverses Escape; ok is false for names Escape never produces.
func Unescape(name string) (key string, ok bool) {
	if !strings.Contains(name, "%") {
		return name, !strings.Contains(name, "/") && name != "." && name != ".."
	}
	k, err := url.PathUnescape(name)
	if err != nil || Escape(k) != name {
		return "", false
	}
	return k, true
}
