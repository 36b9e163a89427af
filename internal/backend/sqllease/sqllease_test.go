package sqllease

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
)

func TestWrapNamesOperationAndSentinelOnce(t *testing.T) {
	unavailable := func(err error) error {
		if errors.Is(err, io.EOF) {
			return fenced.ErrUnavailable
		}
		return nil
	}
	err := Wrap("db", unavailable, "renew", "k", io.EOF)
	if !errors.Is(err, fenced.ErrUnavailable) || !errors.Is(err, io.EOF) || err.Error() != `db: renew "k": authority unavailable: EOF` {
		t.Errorf("classified: %v", err)
	}
	if err := Wrap("db", unavailable, "list", "", context.Canceled); !errors.Is(err, fenced.ErrUnknownOutcome) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want ErrUnknownOutcome and context.Canceled", err)
	}
	other := errors.New("syntax error")
	if err := Wrap("db", unavailable, "list", "", other); errors.Is(err, fenced.ErrUnavailable) || !strings.HasPrefix(err.Error(), "db: list: ") {
		t.Errorf("unclassified: %v", err)
	}
	notHeld := fmt.Errorf("k: %w", fenced.ErrNotHeld)
	if err := Wrap("db", unavailable, "break", "k", notHeld); err != notHeld {
		t.Errorf("a refusal was wrapped again: %v", err)
	}
}
