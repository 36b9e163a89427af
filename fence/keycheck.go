package fence

import (
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced"
)

// ErrWrongKey means a token was presented to a resource bound to another
// lease key. Fences are only comparable within one key: a token of
// "batch:all" with fence 900 says nothing about the holders of
// "invoice:inv_72", and applying it would lock that key's real holder out.
// Nothing is changed.
var ErrWrongKey = errors.New("fence: token is for another lease key")

// CheckKey reports whether t may be presented to a resource bound to the
// lease key bound: t.Key must be a valid lease key (fenced.ValidateKey) and
// equal to bound, byte for byte. An empty bound means the resource is not
// bound yet, so only t.Key's validity is checked. Errors match
// ErrInvalidToken (a bad t.Key) or ErrWrongKey.
func (t Token) CheckKey(bound string) error {
	if err := fenced.ValidateKey(t.Key); err != nil {
		return fmt.Errorf("%w: key: %v", ErrInvalidToken, err)
	}
	if bound != "" && t.Key != bound {
		return wrongKey(t, bound)
	}
	return nil
}

// wrongKey is the ErrWrongKey error for t on a resource bound to bound.
func wrongKey(t Token, bound string) error {
	return fmt.Errorf("%w: the resource is bound to lease key %q, the token (fence %d) is for %q; fences of different keys cannot be compared", ErrWrongKey, bound, t.Fence, t.Key)
}

// restartHint explains a stale refusal whose resource fence is far above
// the presented one (more than twice it). A holder that was granted its
// lease just now and is still refused is then most likely facing a lease
// store whose fence counter started again below the fences this resource
// has seen. Empty when the fences are close: then a newer holder is the
// ordinary explanation.
func restartHint(presented, current uint64) string {
	if presented == 0 || current <= presented || current-presented <= presented {
		return ""
	}
	return fmt.Sprintf(" (far above the presented %d: if the lease was granted just now, the lease store's fence counter has probably restarted below the fences this resource has seen, because the lease table changed, the store moved or lease rows were deleted; raise the store's fence floor above %d, see docs/guards.md)", presented, current)
}
