package fence

import (
	"errors"
	"fmt"
)

// ErrWrongKey means a token was presented to a resource bound to another
// lease key. Fences are comparable only within one key: a token of
// "batch:all" with fence 900 says nothing about the holders of
// "invoice:inv_72". So a guard records the key beside the fence. It refuses
// tokens for any other key, whatever their fence. Nothing is changed.
var ErrWrongKey = errors.New("fence: token is for another lease key")

// checkKey returns an error matching ErrWrongKey unless token, the key a
// token carries, equals bound, the key the resource is bound to.
func checkKey(bound, token string) error {
	if bound != token {
		return fmt.Errorf("%w: token is for %q, resource is bound to %q", ErrWrongKey, token, bound)
	}
	return nil
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
	return fmt.Sprintf(" (far above the presented %d: if the lease was granted just now, the lease store's fence counter "+
		"has probably restarted below the fences this resource has seen, because the lease table changed, the store moved "+
		"or lease rows were deleted; raise the store's fence floor above %d, see docs/guards.md)", presented, current)
}
