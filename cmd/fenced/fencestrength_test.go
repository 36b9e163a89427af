package main

import (
	"errors"
	"testing"

	"github.com/fenced-dev/fenced"
)

func TestParseFenceStrength(t *testing.T) {
	for in, want := range map[string]fenced.FenceStrength{
		"strict": fenced.FenceStrict, "Repeatable": fenced.FenceRepeatable,
		"repeatable-after-failover": fenced.FenceRepeatable, "none": fenced.FenceNone,
	} {
		if got, err := parseFenceStrength(in); err != nil || got != want {
			t.Errorf("parseFenceStrength(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "unset", "weak"} {
		if _, err := parseFenceStrength(in); !errors.Is(err, fenced.ErrInvalidOptions) {
			t.Errorf("parseFenceStrength(%q): %v, want ErrInvalidOptions", in, err)
		}
	}
}
