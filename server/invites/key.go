package invites

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
)

// MinSecretLen is the shortest server secret accepted, in bytes.
const MinSecretLen = 16

// ErrShortSecret refuses a server secret shorter than MinSecretLen.
var ErrShortSecret = errors.New("invites: the server secret must be at least 16 bytes")

// Key keys the stored hash of invite codes with the server's secret: an
// invite is stored under HMAC-SHA256(secret, SHA-256(code)), so a stolen
// database file alone cannot be searched offline for codes (about 59 bits
// each); the secret lives outside it.
//
// The inner SHA-256 is Digest, what invites were stored under before the
// key: Rekey turns such a stored digest into its keyed hash without the
// code, so existing invites move to the keyed form in place, and no
// unkeyed hash is left to look up.
type Key struct {
	secret []byte
}

// NewKey returns the key of secret, which must be at least MinSecretLen
// bytes.
func NewKey(secret []byte) (*Key, error) {
	if len(secret) < MinSecretLen {
		return nil, ErrShortSecret
	}
	return &Key{secret: append([]byte(nil), secret...)}, nil
}

// Hash is the storage key of a normalised code.
func (k *Key) Hash(code string) [32]byte { return k.Rekey(Digest(code)) }

// Rekey is the keyed hash of a code whose Digest is digest.
func (k *Key) Rekey(digest [32]byte) [32]byte {
	m := hmac.New(sha256.New, k.secret)
	m.Write(digest[:])
	var out [32]byte
	m.Sum(out[:0])
	return out
}

// Mark names the key without revealing it: stored beside the invites, it
// tells at start whether they were keyed with this secret.
func (k *Key) Mark() []byte {
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte("breakwater invite key"))
	return m.Sum(nil)[:16]
}

// Digest is the unkeyed SHA-256 of a normalised code: the first step of
// Hash, and the storage key of invites made before the key (schema 2
// and earlier).
func Digest(code string) [32]byte { return sha256.Sum256([]byte(code)) }
