package proof

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
)

// rowKey names what a report row ran: the build ("main", or the fix
// reverted), the backend and the mode ("slice" or "long").
type rowKey struct{ build, backend, mode string }

// keyedRow is a row of a section of docs/proof.md, kept in a JSON file.
type keyedRow interface{ key() rowKey }

// readRows reads the rows kept in path (a JSON array).
func readRows[R any](path string) ([]R, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []R
	if err := json.Unmarshal(b, &rows); err != nil {
		return nil, fmt.Errorf("proof: %s: %w", path, err)
	}
	return rows, nil
}

// saveRow adds row to the rows kept in path, replacing the row of the
// same key. Main's rows come first, then by build, long before slice,
// then by backend.
func saveRow[R keyedRow](path string, row R) error {
	rows, err := readRows[R](path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kept := rows[:0]
	for _, r := range rows {
		if r.key() != row.key() {
			kept = append(kept, r)
		}
	}
	kept = append(kept, row)
	sort.SliceStable(kept, func(i, j int) bool {
		a, b := kept[i].key(), kept[j].key()
		if (a.build == "main") != (b.build == "main") {
			return a.build == "main"
		}
		if a.build != b.build {
			return a.build < b.build
		}
		if a.mode != b.mode {
			return a.mode > b.mode
		}
		return a.backend < b.backend
	})
	b, err := json.MarshalIndent(kept, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
