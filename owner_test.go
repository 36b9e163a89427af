package fenced_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/mem"
)

// fullOwners is a driver that forgets to shorten owners: its admin calls
// report the holder's whole token.
type fullOwners struct {
	*mem.Driver
	token string
}

func (d fullOwners) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	info, err := d.Driver.Inspect(ctx, key)
	info.Owner = d.token
	return info, err
}

func (d fullOwners) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	infos, err := d.Driver.List(ctx, prefix)
	for i := range infos {
		infos[i].Owner = d.token
	}
	return infos, err
}

func (d fullOwners) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	info, err := d.Driver.Break(ctx, key, reason, by)
	info.Owner = d.token
	return info, err
}

func (d fullOwners) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	recs, err := d.Driver.Breaks(ctx, key)
	for i := range recs {
		recs[i].Owner = d.token
	}
	return recs, err
}

// TestAdminNeverShowsWholeOwner checks that the Client shortens owners in
// everything its admin calls return, whatever the driver reported: an
// owner token renews and releases the lease, so it must not leak.
func TestAdminNeverShowsWholeOwner(t *testing.T) {
	ctx := context.Background()
	const full = "0123456789abcdef0123456789abcdef"
	c := fenced.NewClient(fullOwners{mem.New(nil), full}, nil)
	defer c.Close()
	if _, err := c.TryAcquire(ctx, "job:a", &fenced.LeaseOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var owners []string
	info, err := c.Inspect(ctx, "job:a")
	if err != nil {
		t.Fatal(err)
	}
	owners = append(owners, info.Owner)
	infos, err := c.List(ctx, "job:")
	if err != nil || len(infos) != 1 {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	owners = append(owners, infos[0].Owner)
	broken, err := c.Break(ctx, "job:a", "test", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	owners = append(owners, broken.Owner)
	recs, err := c.Breaks(ctx, "job:a")
	if err != nil || len(recs) != 1 {
		t.Fatalf("Breaks = %+v, %v", recs, err)
	}
	owners = append(owners, recs[0].Owner)
	for i, o := range owners {
		if o != token.Short(full) || strings.Contains(o, full[:9]) {
			t.Errorf("admin result %d shows owner %q, want %q", i, o, token.Short(full))
		}
	}
}
