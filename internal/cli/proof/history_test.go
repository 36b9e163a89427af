package proof

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// historyDir returns the directory a proof run of t writes its history
// into: PROOF_KEEP/name if PROOF_KEEP is set, else a fresh temporary
// directory. Unlike t.TempDir, that directory is kept when t fails, so
// the "history in" of a failure (a CI run's, a hog run's) can be read
// afterwards; t's log names it then.
func historyDir(t *testing.T, name string) string {
	t.Helper()
	if keep := os.Getenv("PROOF_KEEP"); keep != "" {
		return filepath.Join(keep, name)
	}
	dir, err := os.MkdirTemp("", "fenced-proof-"+strings.NewReplacer("/", "-", " ", "-").Replace(name)+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("history kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}
