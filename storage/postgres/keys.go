package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/server/keys"
)

// Errors of the records, beside the declaring packages' not-found
// sentinels (keys.ErrNotFound, invites.ErrNotFound), which the records'
// methods return wrapped.
var (
	// ErrExists means a record with the same identity is already stored.
	ErrExists = errors.New("postgres: already exists")
	// ErrInvalid means a record is missing a required field.
	ErrInvalid = errors.New("postgres: invalid record")
)

var _ keys.KeyStore = (*DB)(nil)

// opTimeout bounds the records' statements whose interface carries no
// context (the keyring's, the operator's, the detector's).
const opTimeout = 30 * time.Second

func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// isUniqueViolation reports whether err is PostgreSQL's unique_violation.
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// nullTime is t for a nullable timestamptz column: NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// fromNull is the Go time of a nullable column: zero for NULL, else UTC.
func fromNull(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// CreateKey stores k and creates or updates its user in one transaction,
// notifying the key and the user. It returns ErrExists if a key with k.ID
// or k.Hash is already stored.
//
// u.ID may be empty (it is taken from k.UserID) but must otherwise equal
// k.UserID. A new user is stored as u, with CreatedAt defaulting to
// k.CreatedAt. An existing user keeps its CreatedAt and ban; its plan
// changes only if u.Plan is not empty.
func (db *DB) CreateKey(k keys.Key, u keys.User) error {
	if u.ID == "" {
		u.ID = k.UserID
	}
	if problem := k.Problem(u); problem != "" {
		return fmt.Errorf("create key %s: %w: %s", k.ID, ErrInvalid, problem)
	}
	if u.CreatedAt.IsZero() {
		u.CreatedAt = k.CreatedAt
	}
	ctx, cancel := opContext()
	defer cancel()
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO api_keys (id, hash, user_id, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5)`,
			k.ID, k.Hash[:], k.UserID, k.CreatedAt, nullTime(k.RevokedAt)); err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("key id or hash: %w", ErrExists)
			}
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO users (id, plan, banned, created_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (id) DO UPDATE SET plan = CASE WHEN excluded.plan = '' THEN users.plan ELSE excluded.plan END`,
			u.ID, u.Plan, u.Banned, u.CreatedAt); err != nil {
			return err
		}
		if err := notifyTx(ctx, tx, KindKey, k.ID); err != nil {
			return err
		}
		return notifyTx(ctx, tx, KindUser, u.ID)
	})
	if err != nil {
		return fmt.Errorf("create key %s: %w", k.ID, err)
	}
	return nil
}

// RevokeKey marks key id revoked at at and returns it, notifying the key.
// Revoking a revoked key changes nothing and returns it with its first
// RevokedAt. It returns keys.ErrNotFound (wrapped) for an unknown id.
func (db *DB) RevokeKey(id string, at time.Time) (keys.Key, error) {
	if at.IsZero() {
		return keys.Key{}, fmt.Errorf("revoke key %s: %w: zero time", id, ErrInvalid)
	}
	ctx, cancel := opContext()
	defer cancel()
	var k keys.Key
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		row := tx.QueryRow(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1
			RETURNING id, hash, user_id, created_at, revoked_at`, id, at)
		var err error
		if k, err = scanKey(row); err != nil {
			return err
		}
		return notifyTx(ctx, tx, KindKey, id)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = keys.ErrNotFound
	}
	if err != nil {
		return keys.Key{}, fmt.Errorf("revoke key %s: %w", id, err)
	}
	return k, nil
}

func scanKey(row pgx.Row) (keys.Key, error) {
	var k keys.Key
	var hash []byte
	var created time.Time
	var revoked *time.Time
	if err := row.Scan(&k.ID, &hash, &k.UserID, &created, &revoked); err != nil {
		return keys.Key{}, err
	}
	if len(hash) != len(k.Hash) {
		return keys.Key{}, fmt.Errorf("key %s: hash of %d bytes", k.ID, len(hash))
	}
	copy(k.Hash[:], hash)
	k.CreatedAt, k.RevokedAt = created.UTC(), fromNull(revoked)
	return k, nil
}

// Keys returns every key, active or revoked, sorted by CreatedAt then ID.
func (db *DB) Keys() ([]keys.Key, error) {
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT id, hash, user_id, created_at, revoked_at FROM api_keys ORDER BY created_at, id COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keys.Key, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return list, nil
}

// Key returns the key with the given id, active or revoked, or
// keys.ErrNotFound (wrapped): what a listener reads on a notification of
// KindKey, rather than every key.
func (db *DB) Key(id string) (keys.Key, error) {
	ctx, cancel := opContext()
	defer cancel()
	k, err := scanKey(db.pool.QueryRow(ctx, `SELECT id, hash, user_id, created_at, revoked_at FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		err = keys.ErrNotFound
	}
	if err != nil {
		return keys.Key{}, fmt.Errorf("key %s: %w", id, err)
	}
	return k, nil
}

const userColumns = `id, plan, banned, created_at`

func scanUser(row pgx.Row) (keys.User, error) {
	var u keys.User
	err := row.Scan(&u.ID, &u.Plan, &u.Banned, &u.CreatedAt)
	u.CreatedAt = u.CreatedAt.UTC()
	return u, err
}

// Users returns every user, sorted by ID.
func (db *DB) Users() ([]keys.User, error) {
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT `+userColumns+` FROM users ORDER BY id COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	users, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keys.User, error) { return scanUser(r) })
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	return users, nil
}

// User returns the user with the given id, or keys.ErrNotFound (wrapped).
func (db *DB) User(id string) (keys.User, error) {
	ctx, cancel := opContext()
	defer cancel()
	u, err := scanUser(db.pool.QueryRow(ctx, `SELECT `+userColumns+` FROM users WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		err = keys.ErrNotFound
	}
	if err != nil {
		return keys.User{}, fmt.Errorf("user %s: %w", id, err)
	}
	return u, nil
}

// PutUser stores u, replacing any user with the same ID, and notifies the
// user (a ban or a plan change reaches every instance).
func (db *DB) PutUser(u keys.User) error {
	if u.ID == "" {
		return fmt.Errorf("put user: %w: empty user id", ErrInvalid)
	}
	ctx, cancel := opContext()
	defer cancel()
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO users (id, plan, banned, created_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (id) DO UPDATE SET plan = excluded.plan, banned = excluded.banned, created_at = excluded.created_at`,
			u.ID, u.Plan, u.Banned, u.CreatedAt); err != nil {
			return err
		}
		return notifyTx(ctx, tx, KindUser, u.ID)
	})
	if err != nil {
		return fmt.Errorf("put user %s: %w", u.ID, err)
	}
	return nil
}
