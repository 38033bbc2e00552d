package storage

import (
	"crypto/sha256"
	"time"

	"breakwater/server/keys"
)

// t0 is the tests' fixed now; the keys' behaviour is checked by the suite
// both backends run (backend_test.go).
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newKey returns a key for user with a hash derived from id.
func newKey(id, user string, created time.Time) keys.Key {
	return keys.Key{ID: id, Hash: sha256.Sum256([]byte("secret-" + id)), UserID: user, CreatedAt: created}
}
