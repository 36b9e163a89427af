package leasetable

import (
	"context"
	"errors"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
)

func TestValidateTable(t *testing.T) {
	for _, ok := range []string{"fenced_leases", "_t", "t1", strings.Repeat("t", MaxTableLen)} {
		if err := ValidateTable(ok); err != nil {
			t.Errorf("ValidateTable(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1t", "Leases", "a-b", "a b", `a"b`, "a`b", "x;drop table y", "s.t", "é", strings.Repeat("t", MaxTableLen+1)} {
		if err := ValidateTable(bad); !errors.Is(err, fenced.ErrInvalidURL) {
			t.Errorf("ValidateTable(%q) = %v, want ErrInvalidURL", bad, err)
		}
	}
}

func TestTakeTable(t *testing.T) {
	for raw, want := range map[string]string{"": DefaultTable, "table=abc": "abc", "x=1&table=t_2": "t_2"} {
		p, err := urlquery.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := TakeTable(p); err != nil || got != want {
			t.Errorf("TakeTable(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"table=", "table=a&table=b", "table=A"} {
		p, _ := urlquery.Parse(raw)
		if _, err := TakeTable(p); !errors.Is(err, fenced.ErrInvalidURL) {
			t.Errorf("TakeTable(%q) = %v, want ErrInvalidURL", raw, err)
		}
	}
}

func TestCheckShape(t *testing.T) {
	want := Shape{Columns: []Column{{Name: "k", Type: "text"}, {Name: "fence", Type: "bigint"}}}
	got := Existing{Columns: map[string]ExistingColumn{"k": {Type: "TEXT"}, "fence": {Type: "bigint"}, "extra": {Type: "int"}}}
	if err := Check("t", want, got); err != nil {
		t.Errorf("matching shape with an extra column: %v", err)
	}
	err := Check("t", want, Existing{Columns: map[string]ExistingColumn{"fence": {Type: "integer"}}})
	if !errors.Is(err, ErrSchema) {
		t.Fatalf("wrong shape: %v, want ErrSchema", err)
	}
	for _, s := range []string{"missing column k text", "column fence is integer, want bigint", `table "t"`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q does not say %q", err, s)
		}
	}
}

// Each way a foreign table can break identity or the upsert is named.
func TestCheckKeysAndIdentity(t *testing.T) {
	want := Shape{
		Columns: []Column{
			{Name: "k", Type: "varbinary", Identity: true, MinBytes: 256},
			{Name: "o", Type: "varbinary", Identity: true},
			{Name: "fence", Type: "bigint"},
		},
		Key:           "k",
		AutoIncrement: []string{"fence"},
	}
	good := func() Existing {
		return Existing{
			Columns: map[string]ExistingColumn{"k": {Type: "varbinary", MaxBytes: 256}, "o": {Type: "varbinary"}, "fence": {Type: "bigint", AutoIncrement: true}},
			Unique:  []UniqueIndex{{Name: "PRIMARY", Columns: []string{"k"}}},
		}
	}
	if err := Check("t", want, good()); err != nil {
		t.Fatalf("good shape: %v", err)
	}
	cases := []struct {
		name   string
		change func(*Existing)
		says   string
	}{
		{"no unique index", func(e *Existing) { e.Unique = nil }, "no primary key or unique index on k alone"},
		{"unique on two columns", func(e *Existing) { e.Unique = []UniqueIndex{{Name: "ko", Columns: []string{"k", "o"}}} }, "unique index ko on (k, o) could make the grants of two different keys collide"},
		{"another unique index", func(e *Existing) { e.Unique = append(e.Unique, UniqueIndex{Name: "f", Columns: []string{"fence"}}) }, "unique index f on (fence)"},
		{"expression index", func(e *Existing) { e.Unique = append(e.Unique, UniqueIndex{Name: "lower", Columns: []string{""}}) }, "unique index lower on (an expression)"},
		{"prefix index", func(e *Existing) {
			e.Unique = []UniqueIndex{{Name: "p", Columns: []string{"k"}, Defect: "covers only the first 8 bytes of k"}}
		}, "unique index p on (k) covers only the first 8 bytes"},
		{"auto increment", func(e *Existing) { e.Columns["n"] = ExistingColumn{Type: "int", AutoIncrement: true} }, "column n is AUTO_INCREMENT"},
		{"inexact identity", func(e *Existing) { e.Columns["o"] = ExistingColumn{Type: "varbinary", Inexact: "collation x_ci"} }, "column o: collation x_ci"},
		{"retyped with a collation", func(e *Existing) {
			e.Columns["k"] = ExistingColumn{Type: "varchar", Inexact: "collation latin1_swedish_ci"}
		}, "column k is varchar with collation latin1_swedish_ci, want varbinary"},
		{"too short", func(e *Existing) { e.Columns["k"] = ExistingColumn{Type: "varbinary", MaxBytes: 10} }, "column k holds at most 10 bytes, want 256"},
		{"backend problem", func(e *Existing) { e.Problems = []string{"its engine is MyISAM"} }, "its engine is MyISAM"},
	}
	for _, tc := range cases {
		e := good()
		tc.change(&e)
		err := Check("t", want, e)
		if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v; want ErrSchema saying %q", tc.name, err, tc.says)
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

func TestPruneInBatches(t *testing.T) {
	var afters []string
	deleted, floor, err := PruneInBatches(context.Background(), func(after string) (PruneBatch, error) {
		afters = append(afters, after)
		n := PruneBatchSize
		if len(afters) == 3 {
			n = 7
		}
		return PruneBatch{Examined: n, Deleted: int64(n - 1), Last: fmt.Sprintf("k%d", len(afters)), Floor: uint64(10 * len(afters))}, nil
	})
	if err != nil || deleted != int64(2*(PruneBatchSize-1)+6) || floor != 30 {
		t.Fatalf("PruneInBatches = %d deleted, floor %d, %v", deleted, floor, err)
	}
	if want := []string{"", "k1", "k2"}; !slices.Equal(afters, want) {
		t.Errorf("batches started after %q, want %q", afters, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, _, err = PruneInBatches(ctx, func(string) (PruneBatch, error) {
		calls++
		cancel()
		return PruneBatch{Examined: PruneBatchSize, Deleted: 1}, nil
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("cancelled prune: %v after %d batches, want context.Canceled after 1", err, calls)
	}
	boom := errors.New("boom")
	deleted, floor, err = PruneInBatches(context.Background(), func(after string) (PruneBatch, error) {
		if after != "" {
			return PruneBatch{}, boom
		}
		return PruneBatch{Examined: PruneBatchSize, Deleted: 3, Last: "k", Floor: 9}, nil
	})
	if !errors.Is(err, boom) || deleted != 3 || floor != 9 {
		t.Errorf("failing second batch: %d deleted, floor %d, %v; want the first batch's work and the error", deleted, floor, err)
	}
}

func TestCheckFloorAndAge(t *testing.T) {
	if err := CheckFloor(limits.MaxFenceFloor); err != nil {
		t.Errorf("CheckFloor(MaxFenceFloor) = %v", err)
	}
	if err := CheckFloor(limits.MaxFenceFloor + 1); !errors.Is(err, fenced.ErrInvalidFloor) {
		t.Errorf("CheckFloor(MaxFenceFloor+1) = %v, want ErrInvalidFloor", err)
	}
	if err := CheckOlderThan(0); err != nil {
		t.Errorf("CheckOlderThan(0) = %v", err)
	}
	if err := CheckOlderThan(-time.Nanosecond); !errors.Is(err, fenced.ErrInvalidTTL) {
		t.Errorf("CheckOlderThan(-1ns) = %v, want ErrInvalidTTL", err)
	}
}
