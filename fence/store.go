package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStoreFull means a MemoryStore already remembers MaxKeys keys and
// refused a token for a new one. Forgetting a key's fence would let that
// key's stale holders write again, so the store refuses instead.
var ErrStoreFull = errors.New("fence: store is full")

// Store records the newest token admitted per key, for Middleware.
type Store interface {
	// Admit waits until no other admitted request for t.Key is in progress,
	// then compares t with the newest token recorded for t.Key. If t is
	// admitted it is recorded and Admit returns a done func that the caller
	// must call when its write is finished; until then other requests for
	// the key wait, so admission and write are atomic together. If t is
	// refused, Admit returns the Stale result and a nil done. While waiting
	// it gives up when ctx ends, returning ctx's cause.
	Admit(ctx context.Context, t Token) (Result, func(), error)
}

// keyLocks is one mutex per key, waited for with a context. A key's entry
// exists only while someone holds or waits for it, so idle keys cost
// nothing.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	slot chan struct{} // one slot, full while held
	refs int           // holders and waiters
}

// lock waits until key is free or ctx ends, and returns the func that frees
// it (idempotent).
func (l *keyLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*keyLock)
	}
	e := l.m[key]
	if e == nil {
		e = &keyLock{slot: make(chan struct{}, 1)}
		l.m[key] = e
	}
	e.refs++
	l.mu.Unlock()
	select {
	case e.slot <- struct{}{}:
	case <-ctx.Done():
		l.drop(key, e)
		return nil, context.Cause(ctx)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-e.slot
			l.drop(key, e)
		})
	}, nil
}

func (l *keyLocks) drop(key string, e *keyLock) {
	l.mu.Lock()
	if e.refs--; e.refs == 0 {
		delete(l.m, key)
	}
	l.mu.Unlock()
}

// DefaultMaxKeys is the number of keys MemoryStore.MaxKeys means when
// zero: about 20 MB of fences with typical keys.
const DefaultMaxKeys = 100_000

// MemoryStore is a Store in process memory, for a resource served by one
// process. It serializes the writes of each key and remembers the newest
// token per key until the process exits. A restart forgets every fence. So
// a resource whose state outlives the process should use a SQLStore, or
// record the fence with the state (a SQL guard in the handler's
// transaction).
//
// The zero value is ready to use. It remembers at most MaxKeys keys and
// then refuses tokens for new keys with ErrStoreFull (503 from Middleware).
// It never forgets a fence, since that would let the key's stale holders
// write again. Use a SQLStore for an unbounded set of keys.
type MemoryStore struct {
	// MaxKeys bounds the keys remembered: 0 means DefaultMaxKeys, a
	// negative value means no bound. Set it before first use.
	MaxKeys int

	locks keyLocks
	mu    sync.Mutex
	recs  map[string]memRecord
}

type memRecord struct {
	fence uint64
	owner string
}

// NewMemoryStore returns an empty MemoryStore with the default MaxKeys.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Admit implements Store. Errors: ErrInvalidToken for a bad token,
// ErrStoreFull, and ctx's cause while waiting.
func (s *MemoryStore) Admit(ctx context.Context, t Token) (Result, func(), error) {
	if err := t.Validate(); err != nil {
		return Result{}, nil, err
	}
	unlock, err := s.locks.lock(ctx, t.Key)
	if err != nil {
		return Result{}, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, known := s.recs[t.Key]
	if !known {
		if limit := s.maxKeys(); limit > 0 && len(s.recs) >= limit {
			unlock()
			return Result{}, nil, fmt.Errorf("%w: it remembers %d keys (MaxKeys), refusing new key %q", ErrStoreFull, len(s.recs), t.Key)
		}
	}
	if !t.admits(rec.fence, rec.owner) {
		unlock()
		return classify(t, rec.fence, rec.owner), nil, nil
	}
	if s.recs == nil {
		s.recs = make(map[string]memRecord)
	}
	s.recs[t.Key] = memRecord{fence: t.Fence, owner: t.Owner}
	return Result{Outcome: Applied, Current: t.Fence}, unlock, nil
}

func (s *MemoryStore) maxKeys() int {
	if s.MaxKeys == 0 {
		return DefaultMaxKeys
	}
	return s.MaxKeys
}

// Current returns the newest fence and owner admitted for key (0 and "" if
// none). It does not wait for the key's write in progress, so a handler
// behind Middleware may call it for its own key.
func (s *MemoryStore) Current(key string) (fence uint64, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[key]
	return rec.fence, rec.owner
}

// Len returns the number of keys remembered.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}
