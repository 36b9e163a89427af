package main

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// stampFormat is the time at the start of each of partitions run's own
// stderr lines: UTC, to the millisecond, as a log collector parses it.
const stampFormat = "2006-01-02T15:04:05.000Z07:00"

// lineStamper writes each complete line written to it to w, after the
// time it was completed. A partial line waits for its end. It is safe for
// concurrent use, so lines written whole by several goroutines stay whole.
type lineStamper struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
	buf []byte
}

// newLineStamper returns w with a time at the start of every line.
func newLineStamper(w io.Writer) *lineStamper {
	return &lineStamper{w: w, now: time.Now}
}

// Write implements io.Writer. It reports all of p written once every
// complete line in it has been.
func (s *lineStamper) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := s.now().UTC().AppendFormat(nil, stampFormat)
		line = append(append(line, ' '), s.buf[:i+1]...)
		s.buf = s.buf[i+1:]
		if _, err := s.w.Write(line); err != nil {
			return len(p), err
		}
	}
}
