package fenced_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/mem"
)

// TestOwnerTag: a tagged lease's owner starts with the tag, so that the
// shortened owner of a listing names the holder, and the token still
// has its 128 random bits; a bad tag is refused with the field's name.
func TestOwnerTag(t *testing.T) {
	ctx := context.Background()
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second, OwnerTag: "ab12cd34"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if o := l.Owner(); !strings.HasPrefix(o, "ab12cd34") || len(o) != 8+32 {
		t.Errorf("owner %q: want the tag and 32 hex digits", o)
	}
	info, err := c.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.Owner, "ab12cd34") {
		t.Errorf("listed owner %q does not show the tag", info.Owner)
	}
	for _, tag := range []string{"ABC", "a/b", "123456789"} {
		_, err := c.Resolve(&fenced.LeaseOptions{OwnerTag: tag})
		if !errors.Is(err, fenced.ErrInvalidOptions) || !strings.Contains(err.Error(), "OwnerTag") {
			t.Errorf("OwnerTag %q: got %v, want ErrInvalidOptions naming OwnerTag", tag, err)
		}
	}
}
