package storage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/server/keys"
	"breakwater/server/keys/userid"
)

// errUnknownKeyOrUser is what an unknown key or user id gives: ErrNotFound
// to storage's own callers, and keys.ErrNotFound to the keyring's.
var errUnknownKeyOrUser = fmt.Errorf("%w (%w)", ErrNotFound, keys.ErrNotFound)

// CreateKey stores k and creates or updates its user in one transaction. It
// returns ErrExists if a key with k.ID or k.Hash is already stored.
//
// u.ID may be empty (it is taken from k.UserID) but must otherwise equal
// k.UserID. A new user is stored as u, with CreatedAt defaulting to
// k.CreatedAt. An existing user keeps its CreatedAt and Banned flag; its
// Plan changes only if u.Plan is not empty.
func (db *DB) CreateKey(k keys.Key, u keys.User) error {
	return db.CreateKeys([]keys.Key{k}, []keys.User{u})
}

// CreateKeys is CreateKey for many keys in one transaction (all or none):
// each key of list with its user users[i]. One transaction is what makes
// a large import (or a test's large database) take seconds, not minutes.
func (db *DB) CreateKeys(list []keys.Key, users []keys.User) error {
	if len(users) != len(list) {
		return fmt.Errorf("create keys: %w: %d keys, %d users", ErrInvalid, len(list), len(users))
	}
	users = slices.Clone(users) // the ids defaulted here are not the caller's
	for i, k := range list {
		if users[i].ID == "" {
			users[i].ID = k.UserID
		}
		if problem := k.Problem(users[i]); problem != "" {
			return fmt.Errorf("create key %s: %w: %s", k.ID, ErrInvalid, problem)
		}
	}
	return db.update(func(tx *bbolt.Tx) error {
		for i, k := range list {
			if err := createKey(tx, k, users[i]); err != nil {
				return fmt.Errorf("create key %s: %w", k.ID, err)
			}
		}
		return nil
	})
}

// createKey stores k and creates or updates its user u in tx.
func createKey(tx *bbolt.Tx, k keys.Key, u keys.User) error {
	keyBucket, hashes := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyHashes)
	if keyBucket.Get([]byte(k.ID)) != nil {
		return fmt.Errorf("key id %s: %w", k.ID, ErrExists)
	}
	if hashes.Get(k.Hash[:]) != nil {
		return fmt.Errorf("key hash: %w", ErrExists)
	}
	if err := putJSON(keyBucket, []byte(k.ID), k); err != nil {
		return err
	}
	if err := hashes.Put(k.Hash[:], []byte(k.ID)); err != nil {
		return fmt.Errorf("key hash: %w", err)
	}
	users := tx.Bucket(bucketUsers)
	var old keys.User
	found, err := getJSON(users, []byte(u.ID), &old)
	switch {
	case err != nil:
		return err
	case found:
		if u.Plan != "" {
			old.Plan = u.Plan
		}
		u = old
	case u.CreatedAt.IsZero():
		u.CreatedAt = k.CreatedAt
	}
	return putJSON(users, []byte(u.ID), u)
}

// RevokeKey marks key id revoked at at and returns it. Revoking a revoked
// key changes nothing and returns it with its first RevokedAt. It returns
// ErrNotFound for an unknown id.
func (db *DB) RevokeKey(id string, at time.Time) (keys.Key, error) {
	if at.IsZero() {
		return keys.Key{}, fmt.Errorf("revoke key %s: %w: zero time", id, ErrInvalid)
	}
	var k keys.Key
	err := db.update(func(tx *bbolt.Tx) error {
		keyBucket := tx.Bucket(bucketKeys)
		found, err := getJSON(keyBucket, []byte(id), &k)
		switch {
		case err != nil:
			return err
		case !found:
			return errUnknownKeyOrUser
		case !k.Active():
			return nil
		}
		k.RevokedAt = at
		return putJSON(keyBucket, []byte(id), k)
	})
	if err != nil {
		return keys.Key{}, fmt.Errorf("revoke key %s: %w", id, err)
	}
	return k, nil
}

// Keys returns every key, active or revoked, sorted by CreatedAt then ID.
func (db *DB) Keys() ([]keys.Key, error) {
	var list []keys.Key
	err := db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketKeys).ForEach(func(id, v []byte) error {
			var k keys.Key
			if err := json.Unmarshal(v, &k); err != nil {
				return fmt.Errorf("key %s: %w", id, err)
			}
			list = append(list, k)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	slices.SortFunc(list, func(a, b keys.Key) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return bytes.Compare([]byte(a.ID), []byte(b.ID))
	})
	return list, nil
}

// Users returns every user, sorted by ID.
func (db *DB) Users() ([]keys.User, error) {
	var users []keys.User
	err := db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketUsers).ForEach(func(id, v []byte) error {
			var u keys.User
			if err := json.Unmarshal(v, &u); err != nil {
				return fmt.Errorf("user %s: %w", id, err)
			}
			users = append(users, u)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	return users, nil
}

// User returns the user with the given id, or ErrNotFound (which is also
// keys.ErrNotFound).
func (db *DB) User(id string) (keys.User, error) {
	var u keys.User
	err := db.view(func(tx *bbolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketUsers), []byte(id), &u)
		if err == nil && !found {
			err = errUnknownKeyOrUser
		}
		return err
	})
	if err != nil {
		return keys.User{}, fmt.Errorf("user %s: %w", id, err)
	}
	return u, nil
}

// PutUser stores u, replacing any user with the same ID.
func (db *DB) PutUser(u keys.User) error {
	if u.ID == "" {
		return fmt.Errorf("put user: %w: empty user id", ErrInvalid)
	}
	err := db.update(func(tx *bbolt.Tx) error {
		return putJSON(tx.Bucket(bucketUsers), []byte(u.ID), u)
	})
	if err != nil {
		return fmt.Errorf("put user %s: %w", u.ID, err)
	}
	return nil
}

// legacyJWTKeyID is the KeyID that usage rows of JWT callers carry (early
// rows have none).
const legacyJWTKeyID = "jwt"

// migrateJWTUsers moves users who signed in with a JWT to their own ids
// (schema 3): a token used to act as the user whose id equals its sub, now
// it acts as userid.JWT(sub). The JWT users of the old layout are the ids
// of usage rows written through a JWT, of quota counts that no key belongs
// to, and of user records without a plan that no key belongs to (what
// `users ban` wrote for a JWT user); only a JWT user has those. For
// each, the user record (which holds a ban) and every month's quota count
// are copied to the new id where it has none yet; an id that no key
// belongs to is moved (its old entries deleted), while one that is also an
// API-key user keeps its own, so neither side gains quota or loses a ban.
// Usage rows, statistics events and the daily defense state stay under the
// old id. An id that is not a valid sub under today's rules is left alone
// and counted.
func migrateJWTUsers(tx *bbolt.Tx) ([]any, error) {
	owned := map[string]bool{} // user ids that have a key
	err := tx.Bucket(bucketKeys).ForEach(func(id, v []byte) error {
		var k keys.Key
		if err := json.Unmarshal(v, &k); err != nil {
			return fmt.Errorf("key %s: %w", id, err)
		}
		owned[k.UserID] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	jwtUsers := map[string]bool{}
	err = tx.Bucket(bucketUsage).ForEach(func(k, v []byte) error {
		r, err := decodeUsageRow(v)
		if err != nil {
			return fmt.Errorf("usage row %x: %w", k, err)
		}
		if r.UserID != "" && (r.KeyID == legacyJWTKeyID || r.KeyID == "") {
			jwtUsers[r.UserID] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	users, quota := tx.Bucket(bucketUsers), tx.Bucket(bucketQuota)
	keyless := func(k, _ []byte) error {
		if id := string(k); !owned[id] && !userid.IsJWT(id) {
			jwtUsers[id] = true
		}
		return nil
	}
	err = users.ForEach(func(k, v []byte) error {
		var u keys.User
		if err := json.Unmarshal(v, &u); err != nil {
			return fmt.Errorf("user %s: %w", k, err)
		}
		if u.Plan != "" {
			return nil // not what a ban of a JWT user wrote
		}
		return keyless(k, v)
	})
	if err != nil {
		return nil, err
	}
	var months [][]byte
	err = quota.ForEach(func(month, v []byte) error {
		if v != nil {
			return nil
		}
		months = append(months, append([]byte(nil), month...))
		return quota.Bucket(month).ForEach(keyless)
	})
	if err != nil {
		return nil, err
	}

	moved, copied, counts, skipped := 0, 0, 0, 0
	for _, old := range slices.Sorted(maps.Keys(jwtUsers)) {
		id, err := userid.JWT(old)
		if err != nil || userid.IsJWT(old) {
			skipped++
			continue
		}
		move := !owned[old]
		n, err := moveJWTUser(users, quota, months, old, id, move)
		if err != nil {
			return nil, err
		}
		counts += n
		if move {
			moved++
		} else {
			copied++
		}
	}
	return []any{"jwt_users_moved", moved, "jwt_users_copied", copied, "quota_counts", counts, "skipped", skipped}, nil
}

// moveJWTUser copies the user record and every month's quota count of old
// to id where id has none yet, and deletes old's when move is set; it
// returns how many quota counts it copied. Part of migrateJWTUsers.
func moveJWTUser(users, quota *bbolt.Bucket, months [][]byte, old, id string, move bool) (int, error) {
	if v := users.Get([]byte(old)); v != nil {
		var u keys.User
		if err := json.Unmarshal(v, &u); err != nil {
			return 0, fmt.Errorf("user %s: %w", old, err)
		}
		if users.Get([]byte(id)) == nil {
			u.ID = id
			if err := putJSON(users, []byte(id), u); err != nil {
				return 0, err
			}
		}
		if move {
			if err := users.Delete([]byte(old)); err != nil {
				return 0, fmt.Errorf("user %s: %w", old, err)
			}
		}
	}
	counts := 0
	for _, month := range months {
		b := quota.Bucket(month)
		v := b.Get([]byte(old))
		if v == nil {
			continue
		}
		if b.Get([]byte(id)) == nil {
			if err := b.Put([]byte(id), append([]byte(nil), v...)); err != nil {
				return 0, fmt.Errorf("quota %s of %s: %w", month, id, err)
			}
			counts++
		}
		if move {
			if err := b.Delete([]byte(old)); err != nil {
				return 0, fmt.Errorf("quota %s of %s: %w", month, old, err)
			}
		}
	}
	return counts, nil
}

// putJSON stores v under key in b, JSON-encoded.
func putJSON(b *bbolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if err := b.Put(key, data); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// getJSON decodes the value under key in b into v. It reports false, and
// leaves v alone, when there is no such key. json.Unmarshal copies what it
// keeps, so v stays valid after the transaction.
func getJSON(b *bbolt.Bucket, key []byte, v any) (bool, error) {
	data := b.Get(key)
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("decode %s: %w", key, err)
	}
	return true, nil
}
