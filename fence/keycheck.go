package fence

import (
	"errors"
	"fmt"
)

// ErrWrongKey means a token was presented to a resource bound to another
// lease key. Fences are comparable only within one key, so a guard records
// the key beside the fence and refuses tokens for any other key, whatever
// their fence. Nothing is changed.
var ErrWrongKey = errors.New("fence: token is for another lease key")

// checkKey returns an error matching ErrWrongKey unless token, the key a
// token carries, equals bound, the key the resource is bound to.
func checkKey(bound, token string) error {
	if bound != token {
		return fmt.Errorf("%w: token is for %q, resource is bound to %q", ErrWrongKey, token, bound)
	}
	return nil
}
