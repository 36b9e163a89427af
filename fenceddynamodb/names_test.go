package fenceddynamodb_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fenceddynamodb"
)

// TestTableNames opens stores through the URL opener with table names
// DynamoDB allows (3 to 255 letters, digits, _, - and .), which must be
// created and used, and with names it does not, which must be refused
// before any request, naming the name and the rule.
func TestTableNames(t *testing.T) {
	for _, name := range []string{
		"fenced-leases",
		"Prod.Leases_v2",
		"abc",
		"a-b.c_D-9",
		strings.Repeat("n", 255),
	} {
		d, err := fenceddynamodb.Open(ctxT(t), server.URL(name, "create=1"))
		if err != nil {
			t.Errorf("table %q: %v, want it accepted", name, err)
			continue
		}
		if d.Table() != name {
			t.Errorf("table %q: the driver uses %q", name, d.Table())
		}
		if _, err := d.TryAcquire(ctxT(t), "names:k", "owner-0123456789abcdef", 10*time.Second); err != nil {
			t.Errorf("table %q: TryAcquire: %v", name, err)
		}
		d.Close()
	}
	for _, name := range []string{
		"ab",
		strings.Repeat("n", 256),
		"a b",
		"a/b",
		"a;b",
		"a%40b", // @ after unescaping
		"t%C3%A4ble",
		"a:b",
	} {
		// Port 1: nothing listens, so only a check before any request
		// gives ErrInvalidURL.
		_, err := fenceddynamodb.Open(ctxT(t), "dynamodb://127.0.0.1:1/"+name+"?create=1")
		if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "3 to 255 characters, each a letter, digit, _, - or .") {
			t.Errorf("table %q: %v, want ErrInvalidURL stating DynamoDB's rule", name, err)
		}
	}
	// New applies the same rule to Options.Table.
	_, err := fenceddynamodb.New(ctxT(t), open(t).Client(), &fenceddynamodb.Options{Table: "a b"})
	if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), `"a b"`) {
		t.Errorf("New with table %q: %v, want the name refused", "a b", err)
	}
}
