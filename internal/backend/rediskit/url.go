package rediskit

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/redis/go-redis/v9"
)

// Query holds the fenced-specific query parameters of a redis:// or
// redlock:// URL, removed from the URL before go-redis parses the rest.
type Query struct {
	values map[string]string
	err    error
}

// TakeQuery removes and returns the parameters named in names from u. The
// query is parsed strictly (urlquery). A malformed query or one of names
// given twice is reported by Err. What is left for go-redis is re-encoded,
// so it never sees the malformed part either.
func TakeQuery(u *url.URL, names ...string) *Query {
	q := &Query{values: map[string]string{}}
	p, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		q.fail(err)
		return q
	}
	for _, n := range names {
		v, ok, err := p.Take(n)
		if err != nil {
			q.fail(err)
		}
		if ok {
			q.values[n] = v
		}
	}
	u.RawQuery = p.Rest().Encode()
	return q
}

// String returns the parameter's value or def.
func (q *Query) String(name, def string) string {
	if v := q.values[name]; v != "" {
		return v
	}
	return def
}

// Prefix returns the prefix= parameter, or def, checked with
// CheckPrefix before anything connects; a bad one is reported by Err.
func (q *Query) Prefix(def string) string {
	p := q.String("prefix", def)
	if err := CheckPrefix(p); err != nil {
		q.fail(err)
	}
	return p
}

// Int returns the parameter as a non-negative int, or def.
func (q *Query) Int(name string, def int) int {
	v := q.values[name]
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		q.fail(fmt.Errorf("%w: %s=%q is not a non-negative integer", fenced.ErrInvalidURL, name, v))
		return def
	}
	return n
}

// Duration returns the parameter as a positive duration ("250ms"; a bare
// number means milliseconds), or def.
func (q *Query) Duration(name string, def time.Duration) time.Duration {
	v := q.values[name]
	if v == "" {
		return def
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(n) * time.Millisecond
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		q.fail(fmt.Errorf("%w: %s=%q is not a positive duration such as 250ms", fenced.ErrInvalidURL, name, v))
		return def
	}
	return d
}

func (q *Query) fail(err error) {
	if q.err == nil {
		q.err = err
	}
}

// Err returns the first malformed parameter.
func (q *Query) Err() error { return q.err }

// ClientOptions parses a redis:// URL into go-redis options with fenced's
// defaults. fenced's own parameters must already be taken out by TakeQuery.
// The defaults are these. No command retries unless max_retries is given: a
// retried script whose first attempt was applied would be reported wrongly.
// One dial attempt unless dialer_retries is given. Context deadlines are
// honoured (ContextTimeoutEnabled, which go-redis leaves off). Without it,
// a call on a link that drops packets waits out ReadTimeout, 5s by default,
// whatever its context says. Every client fenced makes from a URL is made
// from these options. Errors wrap fenced.ErrInvalidURL.
func ClientOptions(u *url.URL) (*redis.Options, error) {
	p, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, err
	}
	q := p.Rest()
	ro, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s", fenced.ErrInvalidURL, strings.TrimPrefix(err.Error(), "redis: "))
	}
	if !q.Has("max_retries") {
		ro.MaxRetries = -1
	}
	if !q.Has("dialer_retries") {
		ro.DialerRetries = 1
	}
	ro.ContextTimeoutEnabled = true
	return ro, nil
}
