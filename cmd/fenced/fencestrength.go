package main

import (
	"fmt"
	"strings"

	"github.com/fenced-dev/fenced"
)

// parseFenceStrength parses a minimum fence strength as the CLI and
// configuration files write it: "strict", "repeatable" (or its full name
// "repeatable-after-failover") or "none". Errors match fenced.ErrInvalidOptions.
func parseFenceStrength(s string) (fenced.FenceStrength, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "strict":
		return fenced.FenceStrict, nil
	case "repeatable", fenced.FenceRepeatable.String():
		return fenced.FenceRepeatable, nil
	case "none":
		return fenced.FenceNone, nil
	}
	return 0, fmt.Errorf("%w: fence strength %q: want strict, repeatable or none", fenced.ErrInvalidOptions, s)
}
