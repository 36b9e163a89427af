package proof

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// opCounter counts the operations the workers of a generative run have
// invoked so far, as CheckGen counts them (one per operation, however many
// keys it asked for), reading the history file on from where it stopped.
type opCounter struct {
	path string
	off  int64
	seen map[int64]bool
}

// count returns the number of operations invoked in the history so far.
// A line still being written is left for the next call.
func (c *opCounter) count() (int, error) {
	f, err := os.Open(c.path)
	if err != nil {
		return 0, fmt.Errorf("proof: read history: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, c.off, 1<<62))
	if err != nil {
		return 0, fmt.Errorf("proof: read history: %w", err)
	}
	if c.seen == nil {
		c.seen = map[int64]bool{}
	}
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return len(c.seen), nil
		}
		line := data[:i]
		data = data[i+1:]
		c.off += int64(i + 1)
		var e Event
		if err := json.Unmarshal(line, &e); err != nil {
			return 0, fmt.Errorf("proof: history %s at byte %d: %w", c.path, c.off-int64(i+1), err)
		}
		if e.Kind == AcquireInvoke || e.Kind == BreakInvoke {
			c.seen[e.Op] = true
		}
	}
}
