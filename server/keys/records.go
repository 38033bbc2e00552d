package keys

import (
	"errors"
	"fmt"
	"time"
)

// User is one account that owns API keys and a plan, as a Store holds it.
type User struct {
	ID        string
	Plan      string // plan name from [plans.NAME]; empty means the default plan
	Banned    bool
	CreatedAt time.Time
}

// Key is one API key, as a Store holds it. Only the SHA-256 hash of the
// secret is stored.
type Key struct {
	ID        string
	Hash      [32]byte // SHA-256 of the secret; unique across keys
	UserID    string
	CreatedAt time.Time
	RevokedAt time.Time // zero means the key is active
}

// Problem says what keeps k (with its user u) from being stored, "" when
// nothing does: every backend refuses such a key, with its own error for
// an invalid record, and writes nothing.
func (k Key) Problem(u User) string {
	switch {
	case k.ID == "":
		return "empty key id"
	case k.UserID == "":
		return "empty user id"
	case u.ID != k.UserID:
		return fmt.Sprintf("user %q is not the key's user %q", u.ID, k.UserID)
	case k.Hash == [32]byte{}:
		return "empty hash"
	case k.CreatedAt.IsZero():
		return "zero creation time"
	}
	return ""
}

// Active reports whether k has not been revoked.
func (k Key) Active() bool { return k.RevokedAt.IsZero() }

// ErrNotFound means the key or user asked for does not exist. A Store
// returns it (wrapped) for an unknown id; the keyring, the operator and
// the admin client pass it on, and callers test it with errors.Is.
var ErrNotFound = errors.New("keys: not found")
