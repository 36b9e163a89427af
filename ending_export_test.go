package fenced

// EndHalfway does the first half of ending l as a loss or an expiry does
// (it marks l ended) and returns the second half (cancelling its context
// with cause): tests look at the lease in between, where a goroutine
// ending it is descheduled or waits for the schedule's lock.
func EndHalfway(l *Lease, cause error) (finish func()) {
	l.mu.Lock()
	l.ended = true
	l.mu.Unlock()
	return func() { l.cancel(cause) }
}

// LoseWatched reports a loss to l as its driver's loss watch does.
func LoseWatched(l *Lease, cause error) { l.loseWatched(cause) }
