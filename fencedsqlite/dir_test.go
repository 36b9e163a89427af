package fencedsqlite_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// TestMissingDirectoryIsRefused: a lease file whose directory does not
// exist (a mistyped path) is refused, naming the directory, and nothing is
// created, unless create=1 (Options.CreateDir) asks for the directory.
func TestMissingDirectoryIsRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	missing := filepath.Join(dir, "typo", "x.db")
	if _, err := fencedsqlite.OpenFile(ctx, missing, nil); !errors.Is(err, fencedsqlite.ErrNoDir) || !strings.Contains(err.Error(), filepath.Dir(missing)) {
		t.Errorf("OpenFile in a missing directory: %v, want ErrNoDir naming it", err)
	}
	_, err := fenced.Open(ctx, "sqlite://"+missing, nil)
	if !errors.Is(err, fenced.ErrInvalidURL) || !errors.Is(err, fencedsqlite.ErrNoDir) || !strings.Contains(err.Error(), "create=1") {
		t.Errorf("URL in a missing directory: %v, want ErrInvalidURL and ErrNoDir saying create=1", err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fencedsqlite.OpenFile(ctx, filepath.Join(notDir, "x.db"), nil); !errors.Is(err, fencedsqlite.ErrNoDir) || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("OpenFile under a regular file: %v, want ErrNoDir saying it is not a directory", err)
	}
	if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Fatalf("a refused path left its directory behind: %v", err)
	}
	d, err := fencedsqlite.OpenFile(ctx, missing, &fencedsqlite.Options{CreateDir: true})
	if err != nil {
		t.Fatalf("CreateDir: %v", err)
	}
	d.Close()
	c, err := fenced.Open(ctx, "sqlite://"+filepath.Join(dir, "other", "y.db")+"?create=1", nil)
	if err != nil {
		t.Fatalf("create=1: %v", err)
	}
	c.Close()
	// An existing directory needs nothing: the file itself is created.
	c, err = fenced.Open(ctx, "sqlite://"+filepath.Join(dir, "z.db"), nil)
	if err != nil {
		t.Fatalf("a new file in an existing directory: %v", err)
	}
	c.Close()
}
