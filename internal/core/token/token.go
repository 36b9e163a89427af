// Package token shortens and digests owner tokens, which prove ownership
// and so are never shown whole: the root package, the guards and the
// backends show them the same way.
package token

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/fenced-dev/fenced/driver"
)

// Short returns a prefix of an owner token that is safe to log. A token
// of 8 characters or fewer is returned as it is.
func Short(owner string) string {
	if len(owner) <= 8 {
		return owner
	}
	return owner[:8] + "…"
}

// Digest returns a 32-character hex digest of an owner token: enough to
// tell grants apart, useless for renewing or releasing the lease. Fence
// guards record it (fence.OwnerDigest), and listings carry it
// (driver.LeaseInfo.OwnerDigest).
func Digest(owner string) string {
	sum := sha256.Sum256([]byte("fenced-owner:" + owner))
	return hex.EncodeToString(sum[:16])
}

// Set records the holder's full owner token in i the way admins may see
// it: shortened (Owner) and digested (OwnerDigest).
func Set(i *driver.LeaseInfo, owner string) {
	i.Owner, i.OwnerDigest = Short(owner), Digest(owner)
}
