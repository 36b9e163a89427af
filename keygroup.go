package fenced

import "context"

// keyGroupKey is the context key of an acquisition's key group.
type keyGroupKey struct{}

// WithKeyGroup returns ctx marked so that hooks group the acquisitions made
// with it under group. Recipes use it: a semaphore marks its permits'
// acquisitions with its name, so metrics count one group per semaphore,
// not one per slot.
func WithKeyGroup(ctx context.Context, group string) context.Context {
	return context.WithValue(ctx, keyGroupKey{}, group)
}

// KeyGroup returns the group WithKeyGroup put in ctx, for hooks reading the
// Context of an AttemptEvent or AcquireEvent.
func KeyGroup(ctx context.Context) (group string, ok bool) {
	if ctx == nil {
		return "", false
	}
	group, ok = ctx.Value(keyGroupKey{}).(string)
	return group, ok
}
