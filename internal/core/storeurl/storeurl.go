// Package storeurl parses store URLs for the root package's Open, the
// backends' openers and the CLI, and hides their passwords (Redact) in
// logs and errors.
package storeurl

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/fenced-dev/fenced/internal/core/sentinel"
)

// Parse parses a store URL and checks that it has a scheme. Scheme names
// are lower-cased. Errors match sentinel.ErrInvalidURL.
func Parse(rawURL string) (*url.URL, error) {
	if strings.TrimSpace(rawURL) == "" {
		return nil, fmt.Errorf("fenced: %w: empty URL", sentinel.ErrInvalidURL)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the URL, which may contain a password.
		var ue *url.Error
		msg := err.Error()
		if e, ok := err.(*url.Error); ok {
			ue = e
			msg = ue.Err.Error()
		}
		return nil, fmt.Errorf("fenced: %w: %s: %s", sentinel.ErrInvalidURL, Redact(rawURL), msg)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("fenced: %w: %q has no scheme (want for example sqlite:///path/to/file.db or postgres://host/db)",
			sentinel.ErrInvalidURL, Redact(rawURL))
	}
	u.Scheme = strings.ToLower(u.Scheme)
	return u, nil
}

// Redact returns rawURL with every password replaced by "xxxxx", for logs
// and errors. It covers the userinfo password, secret query parameters
// (password, sslpassword) and URLs nested in query parameters
// (redlock://…?fence=postgres://u:pw@…). A string that does not parse is
// cut at its first '@', and a query that does not parse is dropped.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		if i := strings.LastIndex(rawURL, "@"); i >= 0 {
			rawURL = "…" + rawURL[i:]
		}
		if i := strings.Index(rawURL, "?"); i >= 0 {
			rawURL = rawURL[:i] + "?…"
		}
		return rawURL
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			u.RawQuery = "…"
		} else {
			changed := false
			for k, vs := range q {
				for i, v := range vs {
					r := v
					if strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword") {
						r = "xxxxx"
					} else if strings.Contains(v, "@") {
						r = Redact(v)
					}
					if r != v {
						vs[i], changed = r, true
					}
				}
			}
			if changed {
				u.RawQuery = q.Encode()
			}
		}
	}
	return u.Redacted()
}
