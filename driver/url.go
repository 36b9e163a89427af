package driver

import (
	"net/url"
	"strings"
)

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
