package fenced_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// A backend registers its opener and its Expiry in one call; ExpiryOf reads
// the Expiry back by scheme, case-insensitively, without a connection.
func TestRegisterCarriesTheExpiry(t *testing.T) {
	e, ok := rootaccess.ExpiryOf("MEM")
	if !ok || e.Name != "in-process memory" {
		t.Fatalf("ExpiryOf(MEM) = %+v, %v; want mem's registered Expiry", e, ok)
	}
	if e, ok := rootaccess.ExpiryOf("postgres"); ok {
		t.Fatalf("ExpiryOf(postgres) = %+v, true in a binary that does not link the backend", e)
	}
}

// Registering a scheme twice, in any case, or with a nil opener panics and
// changes nothing, like sql.Register.
func TestRegisterRefusesDuplicatesAndNilOpeners(t *testing.T) {
	open := func(context.Context, *url.URL) (driver.Driver, error) { return mem.New(nil), nil }
	for _, c := range []struct {
		scheme string
		open   func(context.Context, *url.URL) (driver.Driver, error)
		want   string
	}{
		{"MEM", open, "called twice for scheme mem"},
		{"nilopener", nil, "opener is nil for scheme nilopener"},
	} {
		func() {
			defer func() {
				if r, _ := recover().(string); !strings.Contains(r, c.want) {
					t.Errorf("Register(%q) panicked with %q, want %q", c.scheme, r, c.want)
				}
			}()
			fenced.Register(c.scheme, c.open, driver.Expiry{Name: "impostor"})
		}()
	}
	if e, _ := rootaccess.ExpiryOf("mem"); e.Name != "in-process memory" {
		t.Fatalf("a refused registration replaced mem's Expiry: %+v", e)
	}
	if _, ok := rootaccess.ExpiryOf("nilopener"); ok {
		t.Fatal("a refused registration left its scheme registered")
	}
}
