package fence

import (
	"fmt"
	"os"
	"strconv"
)

// Environment variables carrying a token to a command run under a lease
// (`fenced run` sets them for its child). A shell child sends them as the
// HTTP headers:
//
//	curl -H "Fenced-Key: $FENCED_KEY" -H "Fenced-Fence: $FENCED_FENCE" \
//	     -H "Fenced-Owner: $FENCED_OWNER" ...
//
// FENCED_OWNER is OwnerDigest of the lease's owner, never the owner token
// itself, so the child can present the equal-fence, different-owner
// distinction without being able to renew or release the lease.
// FENCED_SIGNATURE is set only where tokens are signed.
const (
	EnvKey       = "FENCED_KEY"
	EnvFence     = "FENCED_FENCE"
	EnvOwner     = "FENCED_OWNER"
	EnvSignature = "FENCED_SIGNATURE"
)

// TokenFromEnv returns the token in the environment variables EnvKey,
// EnvFence, EnvOwner and (optional) EnvSignature, for a program started
// under a lease by `fenced run`. Pass it to WithToken for a Transport. It
// returns an error matching ErrNoToken when none of them is set, and
// ErrInvalidToken, naming the variable, when one is missing or invalid.
func TokenFromEnv() (Token, error) {
	return tokenFromLookup(os.LookupEnv)
}

func tokenFromLookup(lookup func(string) (string, bool)) (Token, error) {
	key, hasKey := lookup(EnvKey)
	fenceStr, hasFence := lookup(EnvFence)
	owner, hasOwner := lookup(EnvOwner)
	sig, _ := lookup(EnvSignature)
	switch {
	case !hasKey && !hasFence && !hasOwner:
		return Token{}, fmt.Errorf("%w: %s, %s and %s are not set (is this command run by `fenced run`?)",
			ErrNoToken, EnvKey, EnvFence, EnvOwner)
	case !hasKey || !hasFence:
		return Token{}, fmt.Errorf("%w: %s and %s must both be set", ErrInvalidToken, EnvKey, EnvFence)
	case !hasOwner:
		return Token{}, fmt.Errorf("%w: %s is not set (a `fenced run` that predates it exports only %s and %s)",
			ErrInvalidToken, EnvOwner, EnvKey, EnvFence)
	}
	f, err := parseFence(fenceStr)
	if err != nil {
		return Token{}, fmt.Errorf("%w: %s: %v", ErrInvalidToken, EnvFence, err)
	}
	t := Token{Key: key, Fence: f, Owner: owner, Sig: sig}
	if err := t.Validate(); err != nil {
		return Token{}, fmt.Errorf("%s, %s, %s or %s: %w", EnvKey, EnvFence, EnvOwner, EnvSignature, err)
	}
	return t, nil
}

// Environ returns t as "NAME=value" entries for a child's environment (see
// TokenFromEnv): EnvKey, EnvFence, EnvOwner, and EnvSignature when t is
// signed.
func Environ(t Token) []string {
	env := []string{EnvKey + "=" + t.Key, EnvFence + "=" + strconv.FormatUint(t.Fence, 10), EnvOwner + "=" + t.Owner}
	if t.Sig != "" {
		env = append(env, EnvSignature+"="+t.Sig)
	}
	return env
}
