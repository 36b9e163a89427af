package fenced

import "context"

// semaphoreKey is the context key under which a Semaphore names itself
// for the hooks of its permits' acquisitions.
type semaphoreKey struct{}

// withSemaphore returns ctx marked as a permit acquisition of the
// semaphore name.
func withSemaphore(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, semaphoreKey{}, name)
}

// SemaphoreOf reports the semaphore whose permit an acquisition is for,
// from the Context of an AttemptEvent or AcquireEvent: a Semaphore marks
// the context of every acquisition of its permits. Hooks use it to group
// a semaphore's permits (PermitKey: name, '#', slot) under the
// semaphore's name without guessing from keys that contain '#'.
func SemaphoreOf(ctx context.Context) (name string, ok bool) {
	if ctx == nil {
		return "", false
	}
	name, ok = ctx.Value(semaphoreKey{}).(string)
	return name, ok
}
