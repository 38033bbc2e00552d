package keys

import (
	"errors"
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

// Active reports whether k has not been revoked.
func (k Key) Active() bool { return k.RevokedAt.IsZero() }

// ErrNotFound means the key or user asked for does not exist. A Store
// returns it (wrapped) for an unknown id; the keyring, the operator and
// the admin client pass it on, and callers test it with errors.Is.
var ErrNotFound = errors.New("keys: not found")
