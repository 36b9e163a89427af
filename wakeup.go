package fenced

// startWaiting registers a waiter for key and returns the channel of the
// next local release of key (see wakeup).
func (c *Client) startWaiting(key string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting[key]++
	c.waiters.Add(1)
	return c.wakeupLocked(key)
}

func (c *Client) stopWaiting(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiters.Add(-1)
	if c.waiting[key]--; c.waiting[key] <= 0 {
		delete(c.waiting, key)
		delete(c.wakeups, key)
	}
}

// wakeup returns a channel closed when a lease on key is next released
// through this client, so local waiters need not wait for a poll. It
// returns nil (never ready) for keys nobody waits on, so the map holds only
// keys with waiters.
func (c *Client) wakeup(key string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wakeupLocked(key)
}

func (c *Client) wakeupLocked(key string) <-chan struct{} {
	if c.waiting[key] == 0 {
		return nil
	}
	ch, ok := c.wakeups[key]
	if !ok {
		ch = make(chan struct{})
		c.wakeups[key] = ch
	}
	return ch
}

// signalRelease wakes the local waiters of key after a release. It counts
// the release first and looks for waiters after, while a waiter registers
// first and looks at the count after, so at least one of them sees the
// other: either the waiter tries again at once, or its channel is closed.
func (c *Client) signalRelease(key string) {
	c.releases.Add(1)
	if c.waiters.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.wakeups[key]; ok {
		close(ch)
		delete(c.wakeups, key)
	}
}
