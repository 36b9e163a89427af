package httpapi

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"unicode"
)

// Token is a bearer token and the name that audit records give its holder.
type Token struct {
	Name   string
	Secret string
}

// MinSecretLen is the shortest token secret accepted, in bytes.
const MinSecretLen = 16

// ReadTokenFile reads tokens from path: one per line, "NAME SECRET", or
// just "SECRET" (named defaultName). Blank lines and lines starting with #
// are skipped. Secrets must be at least MinSecretLen printable non-space
// characters and distinct; names printable without spaces. The file must
// not be readable by group or others (chmod 600), since its secrets
// authorize breaking leases.
//
// Generate a secret with, for example: openssl rand -hex 32.
func ReadTokenFile(path, defaultName string) ([]Token, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("token file %s is readable by group or others (mode %v); chmod 600 it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Token
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		t := Token{Name: defaultName}
		switch len(f) {
		case 1:
			t.Secret = f[0]
		case 2:
			t.Name, t.Secret = f[0], f[1]
		default:
			return nil, fmt.Errorf("token file %s line %d: want NAME SECRET or SECRET, got %d fields", path, n, len(f))
		}
		if err := checkToken(t); err != nil {
			return nil, fmt.Errorf("token file %s line %d: %w", path, n, err)
		}
		if seen[t.Secret] {
			return nil, fmt.Errorf("token file %s line %d: the same secret appears twice", path, n)
		}
		seen[t.Secret] = true
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("token file %s has no token", path)
	}
	return out, nil
}

func checkToken(t Token) error {
	if len(t.Secret) < MinSecretLen {
		return fmt.Errorf("secret is %d bytes, shorter than %d (generate one with: openssl rand -hex 32)", len(t.Secret), MinSecretLen)
	}
	for _, s := range []string{t.Name, t.Secret} {
		if s == "" {
			return errors.New("empty token name")
		}
		for _, r := range s {
			if !unicode.IsPrint(r) || unicode.IsSpace(r) {
				return errors.New("token names and secrets must be printable, without spaces")
			}
		}
	}
	return nil
}

// role is what a token may do.
type role int

const (
	roleClient role = iota + 1 // acquire, renew, release, run the scenario
	roleAdmin                  // everything a client may, and break leases
)

// keyring holds the digests of the tokens, so that comparisons take the
// same time whatever the presented secret's length.
type keyring struct {
	entries []keyEntry
}

type keyEntry struct {
	name   string
	role   role
	digest [sha256.Size]byte
}

func newKeyring(admin, client []Token) (*keyring, error) {
	k := &keyring{}
	seen := map[[sha256.Size]byte]bool{}
	for _, set := range []struct {
		tokens []Token
		role   role
	}{{admin, roleAdmin}, {client, roleClient}} {
		for _, t := range set.tokens {
			if err := checkToken(t); err != nil {
				return nil, fmt.Errorf("httpapi: token %q: %w", t.Name, err)
			}
			d := sha256.Sum256([]byte(t.Secret))
			if seen[d] {
				return nil, fmt.Errorf("httpapi: token %q: the same secret is given twice", t.Name)
			}
			seen[d] = true
			k.entries = append(k.entries, keyEntry{name: t.Name, role: set.role, digest: d})
		}
	}
	return k, nil
}

// lookup compares secret with every token in constant time (no early
// exit) and returns the matching one.
func (k *keyring) lookup(secret string) (keyEntry, bool) {
	d := sha256.Sum256([]byte(secret))
	var found keyEntry
	ok := 0
	for _, e := range k.entries {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			found, ok = e, 1
		}
	}
	return found, ok == 1
}

// authorize checks r's bearer token for need. Without a token it answers
// 401, with an unknown token or one whose role is not enough 403.
func (s *Server) authorize(r *http.Request, need role) (string, *apiError) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", &apiError{status: http.StatusUnauthorized, Code: "unauthorized",
			Message: "this request needs Authorization: Bearer <token>" + s.tokenHint(need)}
	}
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return "", &apiError{status: http.StatusUnauthorized, Code: "unauthorized",
			Message: "the Authorization header must be: Bearer <token>"}
	}
	e, found := s.keys.lookup(strings.TrimSpace(secret))
	switch {
	case !found:
		return "", &apiError{status: http.StatusForbidden, Code: "forbidden", Message: "the token is not valid here"}
	case e.role < need:
		return "", &apiError{status: http.StatusForbidden, Code: "forbidden",
			Message: fmt.Sprintf("token %q is a client token; breaking a lease needs an admin token", e.name)}
	}
	return e.name, nil
}

func (s *Server) tokenHint(need role) string {
	admin, client := 0, 0
	for _, e := range s.keys.entries {
		if e.role == roleAdmin {
			admin++
		} else {
			client++
		}
	}
	switch {
	case need == roleAdmin && admin == 0:
		return " (this server has no admin token: start it with --admin-token-file)"
	case admin+client == 0:
		return " (this server has no token: start it with --admin-token-file or --client-token-file)"
	case need == roleAdmin:
		return " with an admin token"
	}
	return " with a client or admin token"
}
