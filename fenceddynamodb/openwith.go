package fenceddynamodb

import (
	"context"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// OpenWith is Open with options the URL cannot carry: opts' Clock and
// MaxInFlight are used. Its Table and Create are ignored (the URL names
// them). opts may be nil.
func OpenWith(ctx context.Context, rawURL string, opts *Options) (*Driver, error) {
	u, err := storeurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "dynamodb" {
		return nil, fmt.Errorf("%w: scheme %q, want dynamodb", fenced.ErrInvalidURL, u.Scheme)
	}
	d, err := openOpts(ctx, u, opts)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: open %s: %w", storeurl.Redact(rawURL), err)
	}
	return d, nil
}
