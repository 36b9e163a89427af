package leasetable

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

func TestValidateTable(t *testing.T) {
	for _, ok := range []string{"fenced_leases", "_t", "t1", strings.Repeat("t", MaxTableLen)} {
		if err := ValidateTable(ok); err != nil {
			t.Errorf("ValidateTable(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1t", "Leases", "a-b", "a b", `a"b`, "a`b", "x;drop table y", "s.t", "é", strings.Repeat("t", MaxTableLen+1)} {
		if err := ValidateTable(bad); !errors.Is(err, driver.ErrInvalidURL) {
			t.Errorf("ValidateTable(%q) = %v, want ErrInvalidURL", bad, err)
		}
	}
}

func TestTableFromQuery(t *testing.T) {
	for raw, want := range map[string]string{"": DefaultTable, "table=abc": "abc", "x=1&table=t_2": "t_2"} {
		q, err := ParseQuery(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := TableFromQuery(q); err != nil || got != want {
			t.Errorf("TableFromQuery(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"table=", "table=a&table=b", "table=A"} {
		q, _ := url.ParseQuery(raw)
		if _, err := TableFromQuery(q); !errors.Is(err, driver.ErrInvalidURL) {
			t.Errorf("TableFromQuery(%q) = %v, want ErrInvalidURL", raw, err)
		}
	}
	if _, err := ParseQuery("table=a;drop"); !errors.Is(err, driver.ErrInvalidURL) {
		t.Errorf("ParseQuery with a semicolon: %v, want ErrInvalidURL", err)
	}
}

func TestCheckShape(t *testing.T) {
	want := []Column{{"k", "text"}, {"fence", "bigint"}}
	if err := CheckShape("t", want, map[string]string{"k": "TEXT", "fence": "bigint", "extra": "int"}, true); err != nil {
		t.Errorf("matching shape: %v", err)
	}
	err := CheckShape("t", want, map[string]string{"fence": "integer", "extra": "int"}, false)
	if !errors.Is(err, ErrSchema) {
		t.Fatalf("wrong shape: %v, want ErrSchema", err)
	}
	for _, s := range []string{"missing column k text", "column fence is integer, want bigint", "unexpected column extra"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q does not say %q", err, s)
		}
	}
}

type row []any

func (r row) Scan(dest ...any) error {
	for i, d := range dest {
		switch p := d.(type) {
		case *any:
			*p = r[i]
		case *string:
			*p = r[i].(string)
		case *int64:
			*p = r[i].(int64)
		}
	}
	return nil
}

func TestScanBreak(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, v := range []any{at, at.UnixMicro()} {
		r, err := ScanBreak(row{v, "k", int64(7), "abcd…", "why", "who"})
		if err != nil || !r.Time.Equal(at) || r.Key != "k" || r.Fence != 7 || r.Reason != "why" || r.By != "who" {
			t.Errorf("ScanBreak(%T) = %+v, %v", v, r, err)
		}
	}
	if _, err := ScanBreak(row{"yesterday", "k", int64(7), "", "", ""}); err == nil {
		t.Error("ScanBreak accepted a string time")
	}
}

func TestMicros(t *testing.T) {
	if got := Micros(1500 * time.Nanosecond); got != 2 {
		t.Errorf("Micros(1.5µs) = %d, want 2 (rounded up)", got)
	}
	if got := FromMicros(Micros(time.Minute)); got != time.Minute {
		t.Errorf("round trip of a minute = %v", got)
	}
}
