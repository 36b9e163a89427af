package fence

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fenced-dev/fenced"
)

// ErrUnverified means a Checker could not confirm that a token is genuine.
// It is unsigned, signed with an unknown key or a wrong signature, or its
// fence was never granted for its key. The guard changed nothing.
var ErrUnverified = errors.New("fence: token not verified")

// A Checker decides whether a token is genuine before a guard compares its
// fence. Guards (RedisOptions.Check, EtcdOptions.Check,
// MiddlewareOptions.Check) call it after validating the token and before
// touching the resource, and refuse the token when it returns an error.
// A *Verifier checks signatures; a *Sequencer asks the lease store.
//
// Errors should match ErrUnverified for a token that is not genuine and
// ErrStale for one that is genuine but no longer current. Any other error
// (the lease store is unreachable) also refuses the token.
type Checker interface {
	Check(ctx context.Context, t Token) error
}

// MinSecretLen is the shortest HMAC secret NewSigner and NewVerifier
// accept, in bytes: 256 bits, the size of the HMAC-SHA256 output.
const MinSecretLen = 32

// SigningKey is one HMAC-SHA256 key shared by the writers that sign tokens
// and the resources that verify them.
type SigningKey struct {
	// ID names the key inside every signature, so that a Verifier can hold
	// the old and the new key while they are rotated: 1 to 32 characters
	// from [A-Za-z0-9_-].
	ID string
	// Secret is at least MinSecretLen random bytes (from crypto/rand).
	Secret []byte
}

func (k SigningKey) validate() error {
	if k.ID == "" || len(k.ID) > 32 || strings.TrimLeft(k.ID, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
		return fmt.Errorf("fence: signing key id %q: want 1 to 32 characters from [A-Za-z0-9_-]", k.ID)
	}
	if len(k.Secret) < MinSecretLen {
		return fmt.Errorf("fence: signing key %q: secret is %d bytes, want at least %d", k.ID, len(k.Secret), MinSecretLen)
	}
	return nil
}

// mac returns the HMAC-SHA256 of t's key, fence and owner under secret.
// The fields are separated by newlines, which none of them may contain, so
// two different tokens never have the same message.
func mac(secret []byte, t Token) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("fenced-token-v1\n" + t.Key + "\n" + strconv.FormatUint(t.Fence, 10) + "\n" + t.Owner))
	return h.Sum(nil)
}

// Signer signs tokens on the writers' side, so that resources with a
// Verifier can tell genuine tokens from forged ones. Give the secret only to
// the processes that take leases (and the resources): a process that holds
// it can sign any fence.
type Signer struct {
	key SigningKey
}

// NewSigner returns a Signer that signs with key. The secret is copied.
func NewSigner(key SigningKey) (*Signer, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	key.Secret = append([]byte(nil), key.Secret...)
	return &Signer{key: key}, nil
}

// Sign returns t with Sig set to "ID.MAC": the key's id and the unpadded
// base64url HMAC-SHA256 of t's key, fence and owner. Errors match
// ErrInvalidToken when t is not valid. A signature does not expire. A
// signed token stays acceptable until the resource records a newer fence.
// Like the unsigned token, it is a bearer credential for that long. So send
// it only over authenticated, encrypted connections.
func (s *Signer) Sign(t Token) (Token, error) {
	t.Sig = ""
	if err := t.Validate(); err != nil {
		return Token{}, err
	}
	t.Sig = s.key.ID + "." + base64.RawURLEncoding.EncodeToString(mac(s.key.Secret, t))
	return t, nil
}

// Verifier checks the signatures made by Signers. It holds every key a
// current signature may have been made with, by id. To rotate, give the
// Verifiers the new key beside the old one. Then switch the Signers to the
// new key. Drop the old key from the Verifiers once no token signed with it
// is still presented.
type Verifier struct {
	keys map[string][]byte
}

// NewVerifier returns a Verifier accepting signatures made with any of keys,
// which must have distinct ids. The secrets are copied.
func NewVerifier(keys ...SigningKey) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errors.New("fence: NewVerifier: no keys")
	}
	v := &Verifier{keys: make(map[string][]byte, len(keys))}
	for _, k := range keys {
		if err := k.validate(); err != nil {
			return nil, err
		}
		if _, dup := v.keys[k.ID]; dup {
			return nil, fmt.Errorf("fence: NewVerifier: key id %q given twice", k.ID)
		}
		v.keys[k.ID] = append([]byte(nil), k.Secret...)
	}
	return v, nil
}

// Check implements Checker. It returns nil when t.Sig is a signature of t's
// key, fence and owner by one of v's keys, compared in constant time.
// Otherwise it returns an error matching ErrUnverified. The error says
// whether the token was unsigned, named an unknown key or carried a wrong
// signature. A token that is not valid at all gets ErrInvalidToken.
func (v *Verifier) Check(_ context.Context, t Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if t.Sig == "" {
		return fmt.Errorf("%w: token for %q is unsigned", ErrUnverified, t.Key)
	}
	id, enc, ok := strings.Cut(t.Sig, ".")
	if !ok {
		return fmt.Errorf("%w: signature has no key id (want ID.MAC)", ErrUnverified)
	}
	secret, ok := v.keys[id]
	if !ok {
		return fmt.Errorf("%w: signature names unknown key id %.40q", ErrUnverified, id)
	}
	got, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || !hmac.Equal(got, mac(secret, t)) {
		return fmt.Errorf("%w: signature of %s does not match (forged, altered, or signed with another secret under key id %q)",
			ErrUnverified, t, id)
	}
	return nil
}

// Sequencer checks tokens against the lease store, as Chubby's sequencer
// check does: a token passes only while its key is held at the authority
// with exactly its fence. A forged fence above every grant is refused with
// ErrUnverified, and a fence the store has since moved past (or a lease no
// longer held) with ErrStale. It needs no shared secret, but costs one
// Inspect round trip to the lease store per check, and the resource must be
// able to reach the store. A store that cannot be reached refuses the
// token.
//
// The store reports owners shortened, so a Sequencer cannot compare the
// token's owner digest. A writer that learns the current fence can still
// present it under another owner. By writing first, it locks the real holder
// out until the next grant. Use a Verifier where that matters.
type Sequencer struct {
	c *fenced.Client
}

// NewSequencer returns a Sequencer asking c's lease store.
func NewSequencer(c *fenced.Client) (*Sequencer, error) {
	if c == nil {
		return nil, errors.New("fence: NewSequencer: client is nil")
	}
	return &Sequencer{c: c}, nil
}

// Check implements Checker.
func (s *Sequencer) Check(ctx context.Context, t Token) error {
	info, err := s.c.Inspect(ctx, t.Key)
	switch {
	case errors.Is(err, fenced.ErrNotFound):
		return fmt.Errorf("%w: fence %d was never granted for %q (the store has no grant of it)", ErrUnverified, t.Fence, t.Key)
	case err != nil:
		return fmt.Errorf("fence: sequencer check of %s: %w", t, err)
	case t.Fence > info.Fence:
		return fmt.Errorf("%w: fence %d was never granted for %q (the store's newest is %d)", ErrUnverified, t.Fence, t.Key, info.Fence)
	case t.Fence < info.Fence:
		return fmt.Errorf("%w: the store has granted %q fence %d since %d", ErrStale, t.Key, info.Fence, t.Fence)
	case !info.Held:
		return fmt.Errorf("%w: the lease on %q with fence %d is no longer held", ErrStale, t.Key, t.Fence)
	}
	return nil
}

// tokenChecks are the checks a guard runs before it sends anything: the
// token is valid, for the lease key leaseKey derives from the resource (when
// set), and accepted by check (when set).
type tokenChecks struct {
	leaseKey func(resource string) string
	check    Checker
}

func (c tokenChecks) run(ctx context.Context, resource string, t Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if c.leaseKey != nil {
		if err := checkKey(c.leaseKey(resource), t.Key); err != nil {
			return err
		}
	}
	if c.check != nil {
		return c.check.Check(ctx, t)
	}
	return nil
}
