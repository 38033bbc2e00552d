package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/server/invites"
)

var (
	_ invites.Store    = (*DB)(nil)
	_ invites.Redeemer = (*DB)(nil)
)

// Redemption is one e-mail's use of an invite.
type Redemption struct {
	Email string
	At    time.Time
}

const inviteColumns = `hash, id, max_uses, note, created_at, expires_at, revoked_at, used`

func scanInvite(row pgx.Row) (invites.Invite, error) {
	var inv invites.Invite
	var hash []byte
	var expires, revoked *time.Time
	if err := row.Scan(&hash, &inv.ID, &inv.MaxUses, &inv.Note, &inv.CreatedAt, &expires, &revoked, &inv.Used); err != nil {
		return invites.Invite{}, err
	}
	if len(hash) != len(inv.Hash) {
		return invites.Invite{}, fmt.Errorf("invite %s: hash of %d bytes", inv.ID, len(hash))
	}
	copy(inv.Hash[:], hash)
	inv.CreatedAt, inv.ExpiresAt, inv.RevokedAt = inv.CreatedAt.UTC(), fromNull(expires), fromNull(revoked)
	return inv, nil
}

// CreateInvite stores inv, unused. It returns ErrExists if an invite with
// the same hash or ID is stored.
func (db *DB) CreateInvite(inv invites.Invite) error {
	if problem := inv.Problem(); problem != "" {
		return fmt.Errorf("create invite %s: %w: %s", inv.ID, ErrInvalid, problem)
	}
	ctx, cancel := opContext()
	defer cancel()
	_, err := db.pool.Exec(ctx, `INSERT INTO invites (`+inviteColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, 0)`,
		inv.Hash[:], inv.ID, inv.MaxUses, inv.Note, inv.CreatedAt, nullTime(inv.ExpiresAt), nullTime(inv.RevokedAt))
	if isUniqueViolation(err) {
		err = fmt.Errorf("invite id or hash: %w", ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create invite %s: %w", inv.ID, err)
	}
	return nil
}

// querier is what decide needs: the pool, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// checkInviteSQL reads, in one statement, what deciding a redemption
// needs of the invite under $1 and whether e-mail $2 redeemed it. A hit
// and a miss cost the same two index probes and give a row of the same
// fixed-size columns (a miss's are stand-ins, found false), which the
// client decodes the same way, so the time an answer takes does not tell
// a guesser that a code exists.
const checkInviteSQL = `SELECT i.hash IS NOT NULL, coalesce(i.max_uses, 0), coalesce(i.used, 0),
	i.expires_at IS NOT NULL, coalesce(i.expires_at, 'epoch'), i.revoked_at IS NOT NULL,
	EXISTS (SELECT 1 FROM invite_redemptions r WHERE r.hash = $1 AND r.email = $2)
	FROM (SELECT $1::bytea AS h) AS probe LEFT JOIN invites i ON i.hash = probe.h`

// decide reads the invite under hash and tells what a redemption by email
// at now gives. With lock, it first locks the invite's row until the end
// of q: the read that follows, a statement of its own, then sees every
// redemption committed before the lock was granted (a single SELECT ...
// FOR UPDATE would judge them by its snapshot from before the wait).
func decide(ctx context.Context, q querier, hash [32]byte, email string, now time.Time, lock bool) (invites.RedeemOutcome, error) {
	if lock {
		if _, err := q.Exec(ctx, `SELECT 1 FROM invites WHERE hash = $1 FOR UPDATE`, hash[:]); err != nil {
			return invites.InviteUnknown, err
		}
	}
	var found, expires, revoked, redeemed bool
	var inv invites.Invite
	var expiresAt time.Time
	err := q.QueryRow(ctx, checkInviteSQL, hash[:], email).Scan(&found, &inv.MaxUses, &inv.Used, &expires, &expiresAt, &revoked, &redeemed)
	if err != nil {
		return invites.InviteUnknown, err
	}
	if expires {
		inv.ExpiresAt = expiresAt
	}
	if revoked {
		inv.RevokedAt = time.Unix(1, 0) // only whether it is set counts
	}
	outcome := inv.Check(redeemed, now)
	if !found {
		return invites.InviteUnknown, nil
	}
	return outcome, nil
}

// CheckInvite tells what RedeemInvite(hash, email, now) would give,
// without writing anything: invites.InviteUnknown when no invite has that
// hash, from one statement. Only RedeemInvite's answer is binding.
func (db *DB) CheckInvite(hash [32]byte, email string, now time.Time) (invites.RedeemOutcome, error) {
	ctx, cancel := opContext()
	defer cancel()
	outcome, err := decide(ctx, db.pool, hash, email, now, false)
	if err != nil {
		return invites.InviteUnknown, fmt.Errorf("check invite: %w", err)
	}
	return outcome, nil
}

// RedeemInvite takes one use of the invite hashing to hash for email at
// now, durably. The invite's row is locked for the decision, so
// redemptions of one invite are decided one after the other across every
// instance: a one-use code redeemed by several e-mails at once lets
// exactly one in; and the redemption's primary key (invite, e-mail) holds
// one use per e-mail whatever happens. The same e-mail redeeming again is
// invites.InviteAlreadyRedeemed and changes nothing. A refusal is an
// outcome, not an error.
func (db *DB) RedeemInvite(ctx context.Context, hash [32]byte, email string, now time.Time) (invites.RedeemOutcome, error) {
	if email == "" || now.IsZero() {
		return invites.InviteUnknown, fmt.Errorf("redeem invite: %w: empty e-mail or zero time", ErrInvalid)
	}
	var outcome invites.RedeemOutcome
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		decided, err := decide(ctx, tx, hash, email, now, true)
		if err != nil || decided != invites.InviteRedeemed {
			outcome = decided
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO invite_redemptions (hash, email, at) VALUES ($1, $2, $3)`, hash[:], email, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE invites SET used = used + 1 WHERE hash = $1`, hash[:]); err != nil {
			return err
		}
		outcome = invites.InviteRedeemed
		return nil
	})
	if err != nil {
		return invites.InviteUnknown, fmt.Errorf("redeem invite: %w", err)
	}
	return outcome, nil
}

// InviteByHash returns the invite whose code hashes to hash, or
// invites.ErrNotFound (wrapped).
func (db *DB) InviteByHash(hash [32]byte) (invites.Invite, error) {
	ctx, cancel := opContext()
	defer cancel()
	inv, err := scanInvite(db.pool.QueryRow(ctx, `SELECT `+inviteColumns+` FROM invites WHERE hash = $1`, hash[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		err = invites.ErrNotFound
	}
	if err != nil {
		return invites.Invite{}, fmt.Errorf("invite: %w", err)
	}
	return inv, nil
}

// Redemptions returns the redemptions of the invite hashing to hash,
// oldest first, or invites.ErrNotFound (wrapped).
func (db *DB) Redemptions(hash [32]byte) ([]Redemption, error) {
	if _, err := db.InviteByHash(hash); err != nil {
		return nil, fmt.Errorf("invite redemptions: %w", err)
	}
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT email, at FROM invite_redemptions WHERE hash = $1 ORDER BY at, email COLLATE "C"`, hash[:])
	if err != nil {
		return nil, fmt.Errorf("invite redemptions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Redemption, error) {
		var red Redemption
		err := r.Scan(&red.Email, &red.At)
		red.At = red.At.UTC()
		return red, err
	})
	if err != nil {
		return nil, fmt.Errorf("invite redemptions: %w", err)
	}
	return out, nil
}

// Invites returns every invite, sorted by CreatedAt then ID.
func (db *DB) Invites() ([]invites.Invite, error) {
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT `+inviteColumns+` FROM invites ORDER BY created_at, id COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("list invites: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (invites.Invite, error) { return scanInvite(r) })
	if err != nil {
		return nil, fmt.Errorf("list invites: %w", err)
	}
	return out, nil
}

// RevokeInvite marks invite id revoked at at and returns it. Revoking it
// again changes nothing. Its redemptions are kept. It returns
// invites.ErrNotFound (wrapped) for an unknown id.
func (db *DB) RevokeInvite(id string, at time.Time) (invites.Invite, error) {
	if at.IsZero() {
		return invites.Invite{}, fmt.Errorf("revoke invite %s: %w: zero time", id, ErrInvalid)
	}
	ctx, cancel := opContext()
	defer cancel()
	inv, err := scanInvite(db.pool.QueryRow(ctx, `UPDATE invites SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1
		RETURNING `+inviteColumns, id, at))
	if errors.Is(err, pgx.ErrNoRows) {
		err = invites.ErrNotFound
	}
	if err != nil {
		return invites.Invite{}, fmt.Errorf("revoke invite %s: %w", id, err)
	}
	return inv, nil
}

// DeleteInvite removes invite id and its redemptions in one transaction
// and returns what it removed. Its code then finds nothing, as an unknown
// code. It returns invites.ErrNotFound (wrapped) for an unknown id.
func (db *DB) DeleteInvite(id string) (invites.Invite, error) {
	ctx, cancel := opContext()
	defer cancel()
	var inv invites.Invite
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		var err error
		if inv, err = scanInvite(tx.QueryRow(ctx, `DELETE FROM invites WHERE id = $1 RETURNING `+inviteColumns, id)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM invite_redemptions WHERE hash = $1`, inv.Hash[:])
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = invites.ErrNotFound
	}
	if err != nil {
		return invites.Invite{}, fmt.Errorf("delete invite %s: %w", id, err)
	}
	return inv, nil
}

// metaInviteKey names the mark of the secret the invites are keyed with.
const metaInviteKey = "invite_key"

// ErrInviteKeyChanged is returned by RekeyInvites when the invites were
// keyed with another secret than the one given: codes made before do not
// verify until that secret is back. Every instance must run with the same
// secret (BREAKWATER_SECRET): one with another gets this error.
var ErrInviteKeyChanged = errors.New("postgres: invite codes were keyed with another server secret")

// RekeyInvites makes sure every invite is stored under its keyed hash for
// the secret mark names. The first time (no mark stored: invites under
// their unkeyed digest, as a database copied from an old bolt file holds
// them) it moves every invite and its redemptions from hash k to rekey(k)
// and stores mark, in one transaction, and returns how many it moved.
// With mark stored it does nothing; with another mark stored, nothing
// either, and ErrInviteKeyChanged. Instances starting together take
// turns (the mark's row is written under an advisory lock).
func (db *DB) RekeyInvites(mark []byte, rekey func(digest [32]byte) [32]byte) (int, error) {
	if len(mark) == 0 {
		return 0, fmt.Errorf("rekey invites: %w: empty mark", ErrInvalid)
	}
	ctx, cancel := opContext()
	defer cancel()
	moved := 0
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		moved = 0
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock+1); err != nil {
			return err
		}
		var old []byte
		switch err := tx.QueryRow(ctx, `SELECT value FROM meta WHERE name = $1`, metaInviteKey).Scan(&old); {
		case err == nil && bytes.Equal(old, mark):
			return nil
		case err == nil:
			return ErrInviteKeyChanged
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		rows, err := tx.Query(ctx, `SELECT hash FROM invites`)
		if err != nil {
			return err
		}
		digests, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		for _, d := range digests {
			if len(d) != 32 {
				return fmt.Errorf("invite %x: hash of %d bytes", d, len(d))
			}
			keyed := rekey([32]byte(d))
			b.Queue(`UPDATE invites SET hash = $2 WHERE hash = $1`, d, keyed[:])
			b.Queue(`UPDATE invite_redemptions SET hash = $2 WHERE hash = $1`, d, keyed[:])
		}
		b.Queue(`INSERT INTO meta (name, value) VALUES ($1, $2)`, metaInviteKey, mark)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		moved = len(digests)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("rekey invites: %w", err)
	}
	return moved, nil
}

// ImportInvite stores inv as it is, its use count included, with the
// e-mails that redeemed it, in one transaction: for copying a bolt
// database (`breakwater migrate --from`). An invite whose hash or id is
// already stored is left as it is and reported false, so a second copy
// copies nothing twice.
func (db *DB) ImportInvite(inv invites.Invite, redeemed []Redemption) (bool, error) {
	if inv.ID == "" || inv.Hash == [32]byte{} || inv.CreatedAt.IsZero() {
		return false, fmt.Errorf("import invite %s: %w: no id, hash or creation time", inv.ID, ErrInvalid)
	}
	ctx, cancel := opContext()
	defer cancel()
	copied := false
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO invites (`+inviteColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
			inv.Hash[:], inv.ID, inv.MaxUses, inv.Note, inv.CreatedAt, nullTime(inv.ExpiresAt), nullTime(inv.RevokedAt), inv.Used)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		copied = true
		b := &pgx.Batch{}
		for _, r := range redeemed {
			b.Queue(`INSERT INTO invite_redemptions (hash, email, at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, inv.Hash[:], r.Email, r.At)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return false, fmt.Errorf("import invite %s: %w", inv.ID, err)
	}
	return copied, nil
}
