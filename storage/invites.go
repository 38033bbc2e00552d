package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"breakwater/server/invites"
)

// Redemption is one e-mail's use of an invite.
type Redemption struct {
	Email string
	At    time.Time
}

// redemptionValue is what is stored under an e-mail in an invite's
// redemptions bucket.
type redemptionValue struct {
	At time.Time
}

// errUnknownInvite is what an unknown invite id or hash gives: ErrNotFound
// to storage's own callers, and invites.ErrNotFound to theirs.
var errUnknownInvite = fmt.Errorf("%w (%w)", ErrNotFound, invites.ErrNotFound)

// CreateInvite stores inv, unused, with its empty redemptions bucket. It
// returns ErrExists if an invite with the same hash or ID is stored.
func (db *DB) CreateInvite(inv invites.Invite) error {
	if problem := inv.Problem(); problem != "" {
		return fmt.Errorf("create invite %s: %w: %s", inv.ID, ErrInvalid, problem)
	}
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInvites)
		if b.Get(inv.Hash[:]) != nil {
			return fmt.Errorf("invite hash: %w", ErrExists)
		}
		switch _, _, err := findInvite(b, inv.ID); {
		case err == nil:
			return fmt.Errorf("invite id %s: %w", inv.ID, ErrExists)
		case !errors.Is(err, ErrNotFound):
			return err
		}
		// CreateBucket, not CreateBucketIfNotExists: a leftover bucket
		// would hand its e-mails to the new invite.
		if _, err := tx.Bucket(bucketRedemptions).CreateBucket(inv.Hash[:]); err != nil {
			return fmt.Errorf("redemptions bucket: %w", err)
		}
		return putJSON(b, inv.Hash[:], inv)
	})
	if err != nil {
		return fmt.Errorf("create invite %s: %w", inv.ID, err)
	}
	return nil
}

// findInvite scans b for the invite with id, ErrNotFound if there is none.
// Invites are few and this is an admin path, so a scan beats keeping a
// second index in step.
func findInvite(b *bbolt.Bucket, id string) (key []byte, inv *invites.Invite, err error) {
	err = b.ForEach(func(k, v []byte) error {
		if !strings.Contains(string(v), id) { // cheap filter before decoding
			return nil
		}
		var i invites.Invite
		if err := json.Unmarshal(v, &i); err != nil {
			return fmt.Errorf("invite %x: %w", k, err)
		}
		if i.ID == id {
			key, inv = append([]byte(nil), k...), &i
			return errStop
		}
		return nil
	})
	switch {
	case err == errStop:
		return key, inv, nil
	case err == nil:
		return nil, nil, errUnknownInvite
	}
	return nil, nil, err
}

// redemptionsOf returns the redemptions bucket of the invite stored under
// hash. Every invite has one from its creation (or from the migration to
// schema version 2), so a missing bucket is damage, and an error: the
// caller must not take it for "nobody redeemed it".
func redemptionsOf(tx *bbolt.Tx, hash []byte) (*bbolt.Bucket, error) {
	rb := tx.Bucket(bucketRedemptions).Bucket(hash)
	if rb == nil {
		return nil, fmt.Errorf("invite %x: no redemptions bucket", hash)
	}
	return rb, nil
}

// InviteByHash returns the invite whose code hashes to hash, or ErrNotFound.
func (db *DB) InviteByHash(hash [32]byte) (invites.Invite, error) {
	var inv invites.Invite
	err := db.view(func(tx *bbolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketInvites), hash[:], &inv)
		if err == nil && !found {
			err = errUnknownInvite
		}
		return err
	})
	if err != nil {
		return invites.Invite{}, fmt.Errorf("invite: %w", err)
	}
	return inv, nil
}

// CheckInvite tells what RedeemInvite(hash, email, now) would give, from
// one read transaction and without writing anything: invites.InviteUnknown when no
// invite has that hash. It is the cheap look before the write; only
// RedeemInvite's answer is binding. An error means the answer could not
// be read. An unknown hash costs what a known one does (see
// decideRedemption), so the time it takes does not tell whether a code
// exists.
func (db *DB) CheckInvite(hash [32]byte, email string, now time.Time) (invites.RedeemOutcome, error) {
	outcome := invites.InviteUnknown
	err := db.view(func(tx *bbolt.Tx) error {
		var err error
		outcome, _, err = decideRedemption(tx, hash, email, now)
		return err
	})
	if err != nil {
		return invites.InviteUnknown, fmt.Errorf("check invite: %w", err)
	}
	return outcome, nil
}

// decideRedemption reads the invite under hash and whether email redeemed
// it, and tells what a redemption at now gives. It returns the invite for
// the caller to update; outcome invites.InviteUnknown means there is none.
//
// A miss does the work of a hit, on a stand-in: the record after hash in
// key order (the first one past the last) is decoded and judged, its
// redemptions bucket opened and email looked up in it, and all of it
// thrown away. Otherwise an unknown code would be answered measurably
// sooner than one that exists but is refused (expired, used up, revoked,
// or right during a cooldown), which tells a guesser the code is real.
// The stand-in is a real record, so its size and its redemptions bucket
// are drawn from the same invites a hit reads.
func decideRedemption(tx *bbolt.Tx, hash [32]byte, email string, now time.Time) (invites.RedeemOutcome, invites.Invite, error) {
	c := tx.Bucket(bucketInvites).Cursor()
	key, data := c.Seek(hash[:])
	if found := key != nil && bytes.Equal(key, hash[:]); !found {
		standIn(tx, c, key, data, email, now)
		return invites.InviteUnknown, invites.Invite{}, nil
	}
	var inv invites.Invite
	if err := json.Unmarshal(data, &inv); err != nil {
		return invites.InviteUnknown, invites.Invite{}, fmt.Errorf("decode %x: %w", key, err)
	}
	rb, err := redemptionsOf(tx, key)
	if err != nil {
		return invites.InviteUnknown, invites.Invite{}, err
	}
	return inv.Check(rb.Get([]byte(email)) != nil, now), inv, nil
}

// standIn does, for a miss, what decideRedemption does for a hit, on the
// record at (key, data) where the cursor c stopped after the missing key.
// Every answer and error is discarded: a damaged stand-in must not make
// an unknown code fail differently from another.
func standIn(tx *bbolt.Tx, c *bbolt.Cursor, key, data []byte, email string, now time.Time) {
	if key == nil { // past the last key: the first one stands in
		key, data = c.First()
	}
	if key == nil { // no invite stored: no code exists, nothing to hide
		return
	}
	var inv invites.Invite
	_ = json.Unmarshal(data, &inv)
	redeemed := false
	if rb := tx.Bucket(bucketRedemptions).Bucket(key); rb != nil {
		redeemed = rb.Get([]byte(email)) != nil
	}
	_ = inv.Check(redeemed, now)
}

// RedeemInvite takes one use of the invite hashing to hash for email at
// now, durably, through group commit: concurrent redemptions are decided
// one after the other, so a one-use code redeemed by several e-mails at
// once lets exactly one in. The same e-mail redeeming again is
// invites.InviteAlreadyRedeemed and changes nothing. A refusal is an outcome, not
// an error; an error means the decision could not be made or written.
//
// A redemption writes the e-mail's key in the invite's redemptions bucket
// and the invite's use count, in one transaction; its cost does not grow
// with the number of redemptions before it.
func (db *DB) RedeemInvite(ctx context.Context, hash [32]byte, email string, now time.Time) (invites.RedeemOutcome, error) {
	if email == "" || now.IsZero() {
		return invites.InviteUnknown, fmt.Errorf("redeem invite: %w: empty e-mail or zero time", ErrInvalid)
	}
	value, err := json.Marshal(redemptionValue{At: now})
	if err != nil {
		return invites.InviteUnknown, fmt.Errorf("redeem invite: %w: %w", ErrInvalid, err)
	}
	var outcome invites.RedeemOutcome
	err = db.commit(ctx, func(tx *bbolt.Tx) error {
		outcome = invites.InviteUnknown // this function may run more than once
		decided, inv, err := decideRedemption(tx, hash, email, now)
		if err != nil || decided != invites.InviteRedeemed {
			outcome = decided
			return err
		}
		rb, err := redemptionsOf(tx, hash[:])
		if err != nil {
			return err
		}
		if err := rb.Put([]byte(email), value); err != nil {
			return fmt.Errorf("put redemption: %w", err)
		}
		inv.Used++
		if err := putJSON(tx.Bucket(bucketInvites), hash[:], inv); err != nil {
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

// Redemptions returns the redemptions of the invite hashing to hash,
// oldest first, or ErrNotFound. It reads them all: an operator's path, not
// verification's.
func (db *DB) Redemptions(hash [32]byte) ([]Redemption, error) {
	var out []Redemption
	err := db.view(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketInvites).Get(hash[:]) == nil {
			return errUnknownInvite
		}
		rb, err := redemptionsOf(tx, hash[:])
		if err != nil {
			return err
		}
		return rb.ForEach(func(k, v []byte) error {
			var rv redemptionValue
			if err := json.Unmarshal(v, &rv); err != nil {
				return fmt.Errorf("redemption %q: %w", k, err)
			}
			out = append(out, Redemption{Email: string(k), At: rv.At})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("invite redemptions: %w", err)
	}
	slices.SortStableFunc(out, func(a, b Redemption) int { return a.At.Compare(b.At) })
	return out, nil
}

// Invites returns every invite, sorted by CreatedAt then ID.
func (db *DB) Invites() ([]invites.Invite, error) {
	var out []invites.Invite
	err := db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketInvites).ForEach(func(k, v []byte) error {
			var inv invites.Invite
			if err := json.Unmarshal(v, &inv); err != nil {
				return fmt.Errorf("invite %x: %w", k, err)
			}
			out = append(out, inv)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list invites: %w", err)
	}
	slices.SortFunc(out, func(a, b invites.Invite) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// RevokeInvite marks invite id revoked at at and returns it. Revoking it
// again changes nothing. Its redemptions are kept. It returns ErrNotFound
// for an unknown id.
func (db *DB) RevokeInvite(id string, at time.Time) (invites.Invite, error) {
	if at.IsZero() {
		return invites.Invite{}, fmt.Errorf("revoke invite %s: %w: zero time", id, ErrInvalid)
	}
	var inv invites.Invite
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInvites)
		key, found, err := findInvite(b, id)
		if err != nil {
			return err
		}
		inv = *found
		if !inv.RevokedAt.IsZero() {
			return nil
		}
		inv.RevokedAt = at
		return putJSON(b, key, inv)
	})
	if err != nil {
		return invites.Invite{}, fmt.Errorf("revoke invite %s: %w", id, err)
	}
	return inv, nil
}

// DeleteInvite removes invite id and its redemptions bucket in one
// transaction and returns what it removed. Its code then finds nothing, as
// an unknown code. It returns ErrNotFound for an unknown id.
func (db *DB) DeleteInvite(id string) (invites.Invite, error) {
	var inv invites.Invite
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInvites)
		key, found, err := findInvite(b, id)
		if err != nil {
			return err
		}
		inv = *found
		err = tx.Bucket(bucketRedemptions).DeleteBucket(key)
		if err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
			return fmt.Errorf("redemptions bucket: %w", err)
		}
		return b.Delete(key)
	})
	if err != nil {
		return invites.Invite{}, fmt.Errorf("delete invite %s: %w", id, err)
	}
	return inv, nil
}

// legacyInvite is an invite record as schema version 1 wrote it: every
// redemption inside the record, its length the number of uses. Its list
// type is spelled out so that a later change to Redemption cannot change
// how old records are read.
type legacyInvite struct {
	invites.Invite
	Redeemed []struct {
		Email string
		At    time.Time
	}
}

// migrateInviteRedemptions moves each invite's redemptions out of its
// record (schema version 1) into its own bucket under invite_redemptions,
// sets the record's use count, and rewrites the record without the list
// (schema version 2). It runs in prepare's transaction, so it happens
// entirely or not at all, and running it again changes nothing.
//
// The use count is the length of the old list (or a count already stored,
// if larger), as version 1 counted it, so a code never gains uses by the
// upgrade. If an e-mail appears twice in a list (version 1 never wrote
// that), its first redemption is kept.
func migrateInviteRedemptions(tx *bbolt.Tx) ([]any, error) {
	inviteBucket, all := tx.Bucket(bucketInvites), tx.Bucket(bucketRedemptions)
	var records []legacyInvite
	var keys [][]byte
	err := inviteBucket.ForEach(func(k, v []byte) error {
		var rec legacyInvite
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("invite %x: %w", k, err)
		}
		records, keys = append(records, rec), append(keys, append([]byte(nil), k...))
		return nil
	})
	if err != nil {
		return nil, err
	}
	moved := 0
	for i, rec := range records { // the bucket is not changed during ForEach
		rb, err := all.CreateBucketIfNotExists(keys[i])
		if err != nil {
			return nil, fmt.Errorf("invite %x: redemptions bucket: %w", keys[i], err)
		}
		for _, r := range rec.Redeemed {
			if rb.Get([]byte(r.Email)) != nil {
				continue
			}
			v, err := json.Marshal(redemptionValue{At: r.At})
			if err != nil {
				return nil, fmt.Errorf("invite %x: redemption %q: %w", keys[i], r.Email, err)
			}
			if err := rb.Put([]byte(r.Email), v); err != nil {
				return nil, fmt.Errorf("invite %x: redemption %q: %w", keys[i], r.Email, err)
			}
			moved++
		}
		inv := rec.Invite
		inv.Used = max(inv.Used, len(rec.Redeemed))
		if err := putJSON(inviteBucket, keys[i], inv); err != nil {
			return nil, fmt.Errorf("invite %x: %w", keys[i], err)
		}
	}
	return []any{"invites", len(records), "redemptions_moved", moved}, nil
}

// keyInviteKey is the meta key of the mark of the secret the invites are
// keyed with (see RekeyInvites).
var keyInviteKey = []byte("invite_key")

// ErrInviteKeyChanged is returned by RekeyInvites when the invites were
// keyed with another secret than the one given: codes made before do not
// verify until that secret is back.
var ErrInviteKeyChanged = errors.New("storage: invite codes were keyed with another server secret")

// RekeyInvites makes sure every invite is stored under its keyed hash for
// the secret mark names. The first time (no mark in meta: invites stored
// under their unkeyed digest, as before the key), it moves every invite
// and its redemptions bucket from key k to rekey(k) and stores mark, in
// one transaction, so it happens entirely or not at all; it returns how
// many it moved. With mark stored, it does nothing; with another mark
// stored, nothing either, and ErrInviteKeyChanged.
func (db *DB) RekeyInvites(mark []byte, rekey func(digest [32]byte) [32]byte) (int, error) {
	if len(mark) == 0 {
		return 0, fmt.Errorf("rekey invites: %w: empty mark", ErrInvalid)
	}
	moved := 0
	err := db.update(func(tx *bbolt.Tx) error {
		moved = 0
		meta := tx.Bucket(bucketMeta)
		if old := meta.Get(keyInviteKey); old != nil {
			if !bytes.Equal(old, mark) {
				return ErrInviteKeyChanged
			}
			return nil
		}
		inviteBucket, all := tx.Bucket(bucketInvites), tx.Bucket(bucketRedemptions)
		var digests [][32]byte
		err := inviteBucket.ForEach(func(k, _ []byte) error {
			if len(k) != 32 {
				return fmt.Errorf("invite %x: key is not a hash", k)
			}
			digests = append(digests, [32]byte(k))
			return nil
		})
		if err != nil {
			return err
		}
		for _, d := range digests { // the bucket is not changed during ForEach
			var inv invites.Invite
			if _, err := getJSON(inviteBucket, d[:], &inv); err != nil {
				return err
			}
			keyed := rekey(d)
			inv.Hash = keyed
			if err := putJSON(inviteBucket, keyed[:], inv); err != nil {
				return err
			}
			if err := inviteBucket.Delete(d[:]); err != nil {
				return err
			}
			if err := moveBucket(all, d[:], keyed[:]); err != nil {
				return fmt.Errorf("invite %s: redemptions: %w", inv.ID, err)
			}
			moved++
		}
		return meta.Put(keyInviteKey, mark)
	})
	if err != nil {
		return 0, fmt.Errorf("rekey invites: %w", err)
	}
	return moved, nil
}

// moveBucket moves parent's sub-bucket from to a new sub-bucket to (flat:
// redemptions hold no buckets). A missing from leaves an empty to.
func moveBucket(parent *bbolt.Bucket, from, to []byte) error {
	dst, err := parent.CreateBucket(to)
	if err != nil {
		return err
	}
	src := parent.Bucket(from)
	if src == nil {
		return nil
	}
	if err := src.ForEach(func(k, v []byte) error { return dst.Put(k, v) }); err != nil {
		return err
	}
	return parent.DeleteBucket(from)
}

// InviteKeyMark is the mark of the secret the invites are keyed with
// (RekeyInvites), nil when none is stored: what a copy of the database
// into another backend carries along.
func (db *DB) InviteKeyMark() ([]byte, error) {
	var mark []byte
	err := db.view(func(tx *bbolt.Tx) error {
		if m := tx.Bucket(bucketMeta).Get(keyInviteKey); m != nil {
			mark = bytes.Clone(m)
		}
		return nil
	})
	return mark, err
}
