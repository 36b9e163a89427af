// Package storeurl parses store URLs for the root package's Open, the
// backends' openers and the CLI.
package storeurl

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/fenced-dev/fenced/driver"
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
		return nil, fmt.Errorf("fenced: %w: %s: %s", sentinel.ErrInvalidURL, driver.Redact(rawURL), msg)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("fenced: %w: %q has no scheme (want for example sqlite:///path/to/file.db or postgres://host/db)",
			sentinel.ErrInvalidURL, driver.Redact(rawURL))
	}
	u.Scheme = strings.ToLower(u.Scheme)
	return u, nil
}
