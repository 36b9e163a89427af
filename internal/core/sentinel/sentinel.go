// Package sentinel holds the values of the root package's sentinel errors
// that drivers return, so that the root's own internal pieces (URL
// parsing, the TTL rules) can return them without importing the root.
// Everyone else names them as the root exports them: fenced.ErrHeld.
package sentinel

import "errors"

// The values of fenced.ErrHeld and its siblings; see the root package for
// their meaning.
var (
	ErrHeld           = errors.New("lease held by another owner")
	ErrNotHeld        = errors.New("lease not held by this owner")
	ErrLost           = errors.New("lease lost")
	ErrClosed         = errors.New("store closed")
	ErrUnavailable    = errors.New("authority unavailable")
	ErrUnknownOutcome = errors.New("outcome unknown")
	ErrInvalidKey     = errors.New("invalid key")
	ErrInvalidTTL     = errors.New("invalid TTL")
	ErrInvalidURL     = errors.New("invalid store URL")
	ErrNotFound       = errors.New("key not found")
	ErrUnsupported    = errors.New("operation not supported by this backend")
	ErrInvalidFloor   = errors.New("invalid fence floor")

	ErrCheckpointTooLarge = errors.New("checkpoint larger than 64 KiB")
)
