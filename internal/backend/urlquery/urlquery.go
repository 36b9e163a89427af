// Package urlquery reads a store URL's query strictly, the one way every
// backend's URL opener does: url.URL.Query silently drops what it cannot
// parse (a semicolon, a bad escape), and url.Values.Get silently takes the
// first of repeated values, so "table=a;drop" or "table=a&table=b" would
// fall back to another table unnoticed. Here a malformed query, a
// parameter of the backend's own given twice, and (where the backend
// passes nothing on to a client library) an unknown parameter are errors
// matching fenced.ErrInvalidURL that name what was wrong.
package urlquery

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
)

// Params is a parsed query whose parameters are taken one by one.
type Params struct{ v url.Values }

// Parse parses rawQuery (u.RawQuery) strictly.
func Parse(rawQuery string) (Params, error) {
	v, err := url.ParseQuery(rawQuery)
	if err != nil {
		return Params{}, fmt.Errorf("%w: query: %v", fenced.ErrInvalidURL, err)
	}
	return Params{v}, nil
}

// Take removes the parameter name and returns its value; ok is false when
// it is absent. A parameter given more than once is an error.
func (p Params) Take(name string) (value string, ok bool, err error) {
	vs, ok := p.v[name]
	if !ok {
		return "", false, nil
	}
	delete(p.v, name)
	if len(vs) != 1 {
		return "", true, fmt.Errorf("%w: %s= given %d times", fenced.ErrInvalidURL, name, len(vs))
	}
	return vs[0], true, nil
}

// TakeDuration is Take for a positive duration such as 5s or 250ms.
func (p Params) TakeDuration(name string) (d time.Duration, ok bool, err error) {
	v, ok, err := p.Take(name)
	if !ok || err != nil {
		return 0, ok, err
	}
	d, err = time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, true, fmt.Errorf("%w: %s=%q is not a positive duration such as 5s", fenced.ErrInvalidURL, name, v)
	}
	return d, true, nil
}

// TakeBool is Take for a switch: 1, true, on or yes; 0, false, off or no
// (any case).
func (p Params) TakeBool(name string) (b bool, ok bool, err error) {
	v, ok, err := p.Take(name)
	if !ok || err != nil {
		return false, ok, err
	}
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes":
		return true, true, nil
	case "0", "false", "off", "no":
		return false, true, nil
	}
	return false, true, fmt.Errorf("%w: %s=%q, want 1 or 0", fenced.ErrInvalidURL, name, v)
}

// Rest returns the parameters not taken, for a client library that reads
// them itself. The caller owns the result.
func (p Params) Rest() url.Values { return p.v }

// Encode encodes v as url.Values.Encode does, but with spaces as %20, not
// +. pgx reads a query's + literally, so options=-c name=value reached the
// server as "-c+name=value". (A + in a value is %2B either way.)
func Encode(v url.Values) string { return strings.ReplaceAll(v.Encode(), "+", "%20") }

// NoRest refuses any parameter not taken, naming it and the known ones.
func (p Params) NoRest(known ...string) error {
	if len(p.v) == 0 {
		return nil
	}
	var names []string
	for k := range p.v {
		names = append(names, k)
	}
	sort.Strings(names)
	if len(known) == 0 {
		return fmt.Errorf("%w: unknown parameter %q (none are known)", fenced.ErrInvalidURL, names[0])
	}
	return fmt.Errorf("%w: unknown parameter %q (known: %s)", fenced.ErrInvalidURL, names[0], strings.Join(known, ", "))
}
