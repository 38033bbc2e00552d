package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/bbolt"
)

// Invite is one invite code. Only the SHA-256 hash of the normalised code
// is stored; it is the record's key.
type Invite struct {
	ID        string
	Hash      [32]byte
	MaxUses   int // how many different e-mails may redeem it; at least 1
	Note      string
	CreatedAt time.Time
	ExpiresAt time.Time // zero: never
	RevokedAt time.Time // zero: active
	// Redeemed lists the e-mails that redeemed it, in order; its length is
	// the number of uses.
	Redeemed []Redemption
}

// Redemption is one e-mail's use of an invite.
type Redemption struct {
	Email string
	At    time.Time
}

// Uses returns how many uses of inv are taken.
func (inv Invite) Uses() int { return len(inv.Redeemed) }

// RedeemedBy reports whether email has redeemed inv.
func (inv Invite) RedeemedBy(email string) bool {
	return slices.ContainsFunc(inv.Redeemed, func(r Redemption) bool { return r.Email == email })
}

// Check tells what a redemption of inv by email at now would give, without
// changing anything.
func (inv Invite) Check(email string, now time.Time) RedeemOutcome {
	switch {
	case !inv.RevokedAt.IsZero():
		return InviteRevoked
	case inv.RedeemedBy(email):
		return InviteAlreadyRedeemed
	case !inv.ExpiresAt.IsZero() && !now.Before(inv.ExpiresAt):
		return InviteExpired
	case inv.Uses() >= inv.MaxUses:
		return InviteUsedUp
	}
	return InviteRedeemed
}

// RedeemOutcome is what RedeemInvite did.
type RedeemOutcome int

// The outcomes of a redemption. Only InviteRedeemed changes anything.
const (
	// InviteUnknown means no invite has that hash.
	InviteUnknown RedeemOutcome = iota
	// InviteRedeemed means one use was taken for the e-mail.
	InviteRedeemed
	// InviteAlreadyRedeemed means the e-mail had redeemed it before;
	// nothing changed (redemption is idempotent per e-mail).
	InviteAlreadyRedeemed
	// InviteExpired means the invite's expiry has passed.
	InviteExpired
	// InviteUsedUp means every use is taken by other e-mails.
	InviteUsedUp
	// InviteRevoked means the invite was revoked.
	InviteRevoked
)

// OK reports whether the outcome lets the e-mail in.
func (o RedeemOutcome) OK() bool { return o == InviteRedeemed || o == InviteAlreadyRedeemed }

// String names the outcome as logs and metrics do.
func (o RedeemOutcome) String() string {
	switch o {
	case InviteRedeemed:
		return "redeemed"
	case InviteAlreadyRedeemed:
		return "already_redeemed"
	case InviteExpired:
		return "expired"
	case InviteUsedUp:
		return "used_up"
	case InviteRevoked:
		return "revoked"
	}
	return "invalid"
}

// CreateInvite stores inv. It returns ErrExists if an invite with the same
// hash or ID is stored.
func (db *DB) CreateInvite(inv Invite) error {
	switch {
	case inv.ID == "":
		return fmt.Errorf("create invite: %w: empty id", ErrInvalid)
	case inv.Hash == [32]byte{}:
		return fmt.Errorf("create invite %s: %w: empty hash", inv.ID, ErrInvalid)
	case inv.MaxUses < 1:
		return fmt.Errorf("create invite %s: %w: max uses %d", inv.ID, ErrInvalid, inv.MaxUses)
	case inv.CreatedAt.IsZero():
		return fmt.Errorf("create invite %s: %w: zero creation time", inv.ID, ErrInvalid)
	}
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInvites)
		if b.Get(inv.Hash[:]) != nil {
			return fmt.Errorf("invite hash: %w", ErrExists)
		}
		if _, found, err := findInvite(b, inv.ID); err != nil || found != nil {
			if err == nil {
				err = fmt.Errorf("invite id %s: %w", inv.ID, ErrExists)
			}
			return err
		}
		return putJSON(b, inv.Hash[:], inv)
	})
	if err != nil {
		return fmt.Errorf("create invite %s: %w", inv.ID, err)
	}
	return nil
}

// findInvite scans b for the invite with id. Invites are few and this is
// an admin path, so a scan beats keeping a second index in step.
func findInvite(b *bbolt.Bucket, id string) (key []byte, inv *Invite, err error) {
	err = b.ForEach(func(k, v []byte) error {
		if !strings.Contains(string(v), id) { // cheap filter before decoding
			return nil
		}
		var i Invite
		if err := json.Unmarshal(v, &i); err != nil {
			return fmt.Errorf("invite %x: %w", k, err)
		}
		if i.ID == id {
			key, inv = append([]byte(nil), k...), &i
			return errStop
		}
		return nil
	})
	if err == errStop {
		err = nil
	}
	return key, inv, err
}

// InviteByHash returns the invite whose code hashes to hash, or ErrNotFound.
func (db *DB) InviteByHash(hash [32]byte) (Invite, error) {
	var inv Invite
	err := db.view(func(tx *bbolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketInvites), hash[:], &inv)
		if err == nil && !found {
			err = ErrNotFound
		}
		return err
	})
	if err != nil {
		return Invite{}, fmt.Errorf("invite: %w", err)
	}
	return inv, nil
}

// RedeemInvite takes one use of the invite hashing to hash for email at
// now, durably, through group commit: concurrent redemptions are decided
// one after the other, so a one-use code redeemed by several e-mails at
// once lets exactly one in. The same e-mail redeeming again is
// InviteAlreadyRedeemed and changes nothing. A refusal is an outcome, not
// an error; an error means the decision could not be made or written.
func (db *DB) RedeemInvite(ctx context.Context, hash [32]byte, email string, now time.Time) (RedeemOutcome, error) {
	if email == "" || now.IsZero() {
		return InviteUnknown, fmt.Errorf("redeem invite: %w: empty e-mail or zero time", ErrInvalid)
	}
	var outcome RedeemOutcome
	err := db.commit(ctx, func(tx *bbolt.Tx) error {
		outcome = InviteUnknown // this function may run more than once
		b := tx.Bucket(bucketInvites)
		var inv Invite
		found, err := getJSON(b, hash[:], &inv)
		if err != nil || !found {
			return err
		}
		outcome = inv.Check(email, now)
		if outcome != InviteRedeemed {
			return nil
		}
		inv.Redeemed = append(inv.Redeemed, Redemption{Email: email, At: now})
		return putJSON(b, hash[:], inv)
	})
	if err != nil {
		return InviteUnknown, fmt.Errorf("redeem invite: %w", err)
	}
	return outcome, nil
}

// Invites returns every invite, sorted by CreatedAt then ID.
func (db *DB) Invites() ([]Invite, error) {
	var out []Invite
	err := db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketInvites).ForEach(func(k, v []byte) error {
			var inv Invite
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
	slices.SortFunc(out, func(a, b Invite) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// RevokeInvite marks invite id revoked at at and returns it. Revoking it
// again changes nothing. It returns ErrNotFound for an unknown id.
func (db *DB) RevokeInvite(id string, at time.Time) (Invite, error) {
	if at.IsZero() {
		return Invite{}, fmt.Errorf("revoke invite %s: %w: zero time", id, ErrInvalid)
	}
	var inv Invite
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInvites)
		key, found, err := findInvite(b, id)
		switch {
		case err != nil:
			return err
		case found == nil:
			return ErrNotFound
		}
		inv = *found
		if !inv.RevokedAt.IsZero() {
			return nil
		}
		inv.RevokedAt = at
		return putJSON(b, key, inv)
	})
	if err != nil {
		return Invite{}, fmt.Errorf("revoke invite %s: %w", id, err)
	}
	return inv, nil
}

// CheckInvite tells what RedeemInvite(hash, email, now) would give, from
// one read transaction and without writing anything: InviteUnknown when no
// invite has that hash. It is the cheap look before the write; only
// RedeemInvite's answer is binding. An error means the answer could not
// be read.
func (db *DB) CheckInvite(hash [32]byte, email string, now time.Time) (RedeemOutcome, error) {
	inv, err := db.InviteByHash(hash)
	switch {
	case errors.Is(err, ErrNotFound):
		return InviteUnknown, nil
	case err != nil:
		return InviteUnknown, fmt.Errorf("check invite: %w", err)
	}
	return inv.Check(email, now), nil
}
