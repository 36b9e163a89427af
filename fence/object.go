package fence

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/fenced-dev/fenced"
)

// Errors an ObjectStore returns for the Object guard to act on.
var (
	// ErrObjectNotFound means the object does not exist.
	ErrObjectNotFound = errors.New("fence: object not found")
	// ErrObjectChanged means a conditional write was refused because the
	// object is no longer the version it was conditioned on (HTTP 412, or
	// 409 for a concurrent conditional write). Nothing was written.
	ErrObjectChanged = errors.New("fence: object changed since it was read")
)

// Metadata keys the Object guard records the newest admitted token under,
// beside the object's own metadata: the lease key (percent-encoded, since
// object stores carry metadata in HTTP headers, which are ASCII), the
// fence in decimal and the owner digest. Keys are lower case.
const (
	MetaKey   = "fenced-key"
	MetaFence = "fenced-fence"
	MetaOwner = "fenced-owner"
)

// ObjectVersion is one version of an object: its content, its metadata
// (keys in lower case) and, as returned by Get, its version tag.
type ObjectVersion struct {
	Body     []byte
	Metadata map[string]string
	// Tag identifies this version for a conditional write: an ETag or a
	// generation number. Empty in a version to be written.
	Tag string
}

// ObjectStore is the part of an object store the Object guard needs:
// whole-object reads and conditional whole-object writes (S3's If-Match and
// If-None-Match, GCS's generation preconditions). Package fence/s3fence
// implements it for S3-compatible stores.
//
// Tags must differ for every write, whatever the content. A tag that comes
// back for other content would let a write conditioned on an old version
// overwrite a newer one (ABA). S3's ETag is such a tag: it is the MD5 of the
// body, so writing the same bytes again gives the same ETag. An
// implementation over such a store makes each write's content unique
// (s3fence adds a nonce).
type ObjectStore interface {
	// Get returns the object's current version, or an error matching
	// ErrObjectNotFound.
	Get(ctx context.Context, name string) (ObjectVersion, error)
	// Put writes v as the object's content and metadata only if the
	// object's current version has tag ifTag, or, with ifTag "", only if
	// the object does not exist. A failed condition returns an error
	// matching ErrObjectChanged. It returns the new version's tag.
	Put(ctx context.Context, name string, v ObjectVersion, ifTag string) (tag string, err error)
}

// ObjectOptions configure NewObject. nil gives the defaults.
type ObjectOptions struct {
	// LeaseKey, when set, returns the lease key that guards object name; a
	// token for another key is refused with ErrWrongKey before anything is
	// read, even for an object not yet bound.
	LeaseKey func(name string) string
	// Check, when set, must accept every token before it is compared (for
	// example a *Verifier for signed tokens); a refusal is returned as the
	// error and nothing is written.
	Check Checker
	// Hook receives an EventStaleWrite for every refused stale token (when
	// nil, the hook of the client that issued the token).
	Hook func(fenced.Event)
	// MaxRaces bounds how often one write re-reads the object after
	// another write won the race to it. Default 16.
	MaxRaces int
}

// Object guards objects in an object store. Each object carries the newest
// admitted token in its metadata (MetaKey, MetaFence, MetaOwner). A write
// reads the object, checks the token against it, and writes with a
// precondition on the version it read. So a write that landed in between
// makes it read and decide again. Its methods are safe for concurrent use.
//
// The first admitted write binds an object to its token's lease key. A
// token for any other key is then refused with ErrWrongKey whatever its
// fence, because fences are only comparable within one key.
//
// Object stores have no transactions across objects. The guard protects
// each object on its own. A reader that does not go through the guard
// sees the content as written by the store's implementation (see s3fence
// for its format).
type Object struct {
	store    ObjectStore
	checks   tokenChecks
	hook     func(fenced.Event)
	maxRaces int
}

// NewObject returns a guard over store. opts may be nil.
func NewObject(store ObjectStore, opts *ObjectOptions) (*Object, error) {
	if store == nil {
		return nil, errors.New("fence: NewObject: store is nil")
	}
	g := &Object{store: store, maxRaces: 16}
	if opts != nil {
		g.hook = opts.Hook
		g.checks = tokenChecks{leaseKey: opts.LeaseKey, check: opts.Check}
		if opts.MaxRaces > 0 {
			g.maxRaces = opts.MaxRaces
		}
	}
	return g, nil
}

// Write replaces the content of object name with body if t is admitted:
// t's fence is newer than the object's, or equal with the same owner. A
// missing object is created. A refused token gives a Stale result with the
// object's fence, and nothing is written.
func (g *Object) Write(ctx context.Context, name string, t Token, body []byte) (Result, error) {
	return g.Update(ctx, name, t, func([]byte, bool) ([]byte, error) { return body, nil })
}

// Claim records t on object name without changing its content (a missing
// object is created empty), so every older holder's later write is
// refused. A new holder claims first, then reads the state it inherits.
func (g *Object) Claim(ctx context.Context, name string, t Token) (Result, error) {
	return g.Update(ctx, name, t, func(cur []byte, _ bool) ([]byte, error) { return cur, nil })
}

// Update is a guarded read-modify-write of object name. If t is admitted,
// fn gets the current content (exists false when there is none) and
// returns the new content. It is written conditionally on the version
// read. If another write lands in between, Update reads again and calls fn
// again (so fn must not have side effects). fn returning an error matching
// ErrPrecondition gives a PreconditionFailed result (the fence was fine,
// the work is not to be done). Other errors of fn are returned as is.
// Nothing is written unless the result is Applied. Errors: ErrInvalidToken
// for a bad token, ErrWrongKey for a token of another lease key, the
// Checker's error when it refuses t, and the store's errors wrapped. An
// error after the PUT was sent may mean it was applied: read before
// retrying.
func (g *Object) Update(ctx context.Context, name string, t Token, fn func(current []byte, exists bool) ([]byte, error)) (Result, error) {
	if err := g.checks.run(ctx, name, t); err != nil {
		return Result{}, fmt.Errorf("fence: write object %q: %w", name, err)
	}
	for range g.maxRaces {
		cur, exists, fence, owner, err := g.read(ctx, name)
		if err != nil {
			return Result{}, err
		}
		if enc, ok := cur.Metadata[MetaKey]; ok {
			bound, err := url.PathUnescape(enc)
			if err != nil {
				return Result{}, fmt.Errorf("fence: object %q: metadata %s is %q, want a percent-encoded lease key", name, MetaKey, enc)
			}
			if err := checkKey(bound, t.Key); err != nil {
				return Result{}, fmt.Errorf("fence: write object %q: %w", name, err)
			}
		}
		if !t.admits(fence, owner) {
			r := classify(t, fence, owner)
			report(g.hook, t, r, name)
			return r, nil
		}
		body, err := fn(cur.Body, exists)
		if errors.Is(err, ErrPrecondition) {
			return Result{Outcome: PreconditionFailed, Current: fence}, nil
		}
		if err != nil {
			return Result{}, err
		}
		meta := map[string]string{}
		for k, v := range cur.Metadata {
			meta[k] = v
		}
		meta[MetaKey] = url.PathEscape(t.Key)
		meta[MetaFence] = strconv.FormatUint(t.Fence, 10)
		meta[MetaOwner] = t.Owner
		_, err = g.store.Put(ctx, name, ObjectVersion{Body: body, Metadata: meta}, cur.Tag)
		if errors.Is(err, ErrObjectChanged) {
			continue // another write won the race: decide again on what it wrote
		}
		if err != nil {
			return Result{}, fmt.Errorf("fence: write object %q: %w", name, err)
		}
		return Result{Outcome: Applied, Current: t.Fence}, nil
	}
	return Result{}, fmt.Errorf("fence: write object %q: lost the race to other writers %d times; nothing was written", name, g.maxRaces)
}

// Current returns the newest token recorded on object name (fence 0 when
// the object does not exist or was never written through a guard).
func (g *Object) Current(ctx context.Context, name string) (fence uint64, owner string, err error) {
	_, _, fence, owner, err = g.read(ctx, name)
	return fence, owner, err
}

// Read returns object name's content and the newest token recorded on it.
// A missing object is an error matching ErrObjectNotFound.
func (g *Object) Read(ctx context.Context, name string) (body []byte, fence uint64, owner string, err error) {
	cur, exists, fence, owner, err := g.read(ctx, name)
	if err == nil && !exists {
		err = fmt.Errorf("fence: read object %q: %w", name, ErrObjectNotFound)
	}
	return cur.Body, fence, owner, err
}

func (g *Object) read(ctx context.Context, name string) (cur ObjectVersion, exists bool, fence uint64, owner string, err error) {
	cur, err = g.store.Get(ctx, name)
	if errors.Is(err, ErrObjectNotFound) {
		return ObjectVersion{}, false, 0, "", nil
	}
	if err != nil {
		return cur, false, 0, "", fmt.Errorf("fence: read object %q: %w", name, err)
	}
	if v, ok := cur.Metadata[MetaFence]; ok {
		if fence, err = strconv.ParseUint(v, 10, 64); err != nil {
			return cur, true, 0, "", fmt.Errorf("fence: object %q: metadata %s is %q, want a fence", name, MetaFence, v)
		}
	}
	return cur, true, fence, cur.Metadata[MetaOwner], nil
}
