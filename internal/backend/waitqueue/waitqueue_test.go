package waitqueue

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// hookLog records the hooks' calls.
type hookLog struct {
	mu    sync.Mutex
	calls []string
	seen  chan struct{}
}

func (h *hookLog) hooks() Hooks[string] {
	rec := func(kind string) func(context.Context, string, string) {
		return func(_ context.Context, k, member string) {
			h.mu.Lock()
			h.calls = append(h.calls, kind+" "+k+" "+member)
			h.mu.Unlock()
			h.seen <- struct{}{}
		}
	}
	return Hooks[string]{Leave: rec("leave"), Requeue: rec("requeue")}
}

func (h *hookLog) next(t *testing.T) string {
	t.Helper()
	select {
	case <-h.seen:
	case <-time.After(5 * time.Second):
		t.Fatal("no hook ran")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[len(h.calls)-1]
}

// An episode lasts from its first waiter's Join to its last waiter's Leave,
// under one member; a waiter leaving before the last requeues the member,
// the last ends the episode, and the next Join starts a new member.
func TestEpisodes(t *testing.T) {
	h := &hookLog{seen: make(chan struct{}, 8)}
	q := New("p1", h.hooks())
	a := q.Join("job")
	b := q.Join("job")
	if a != b || !strings.HasPrefix(a.Member(), "p1:") {
		t.Fatalf("two waiters of one key: episodes %v and %v, want one member p1:…", a.Member(), b.Member())
	}
	if n, m := q.Current("job"); n != 2 || m != a.Member() {
		t.Fatalf("Current = %d, %q; want 2, %q", n, m, a.Member())
	}
	q.Leave("job", "job", a)
	if got := h.next(t); got != "requeue job "+a.Member() {
		t.Fatalf("first leave ran %q, want a requeue of the member", got)
	}
	q.Leave("job", "job", b)
	if got := h.next(t); got != "leave job "+a.Member() {
		t.Fatalf("last leave ran %q, want the episode's end", got)
	}
	if n, m := q.Current("job"); n != 0 || m != "" {
		t.Fatalf("Current after the episode = %d, %q; want none", n, m)
	}
	c := q.Join("job")
	if c.Member() == a.Member() {
		t.Fatal("a new episode reused the old member: the old episode's end would take it off the queue")
	}
	q.Close()
	q.Leave("job", "job", c)
	select {
	case <-h.seen:
		t.Fatal("a hook ran after Close")
	case <-time.After(50 * time.Millisecond):
	}
}
