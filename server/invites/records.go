package invites

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Invite is one invite code, as a Redeemer and a Store hold it. Only a
// hash of the normalised code is stored, keyed with the server's secret
// (HMAC; see Key); it is the record's identity.
//
// The e-mails that redeemed it are not in the record: a backend keeps
// each apart, so a redemption writes one small entry whatever the number
// before it, and "has this e-mail redeemed it" is one read.
type Invite struct {
	ID        string
	Hash      [32]byte
	MaxUses   int // how many different e-mails may redeem it; at least 1
	Note      string
	CreatedAt time.Time
	ExpiresAt time.Time // zero: never
	RevokedAt time.Time // zero: active
	// Used is how many uses are taken. It is written in the same
	// transaction as each redemption, so the max-uses check never counts
	// the redemptions.
	Used int
}

// Problem says what keeps inv from being created, "" when nothing does:
// every backend refuses such an invite, with its own error for an invalid
// record, and writes nothing.
func (inv Invite) Problem() string {
	switch {
	case inv.ID == "":
		return "empty id"
	case inv.Hash == [32]byte{}:
		return "empty hash"
	case inv.MaxUses < 1:
		return fmt.Sprintf("max uses %d", inv.MaxUses)
	case inv.CreatedAt.IsZero():
		return "zero creation time"
	case inv.Used != 0:
		return fmt.Sprintf("%d uses taken before creation", inv.Used)
	}
	return ""
}

// Check tells what a redemption of inv at now would give, given whether
// the e-mail has redeemed it before, without changing anything. A
// backend's CheckInvite and RedeemInvite decide with it.
func (inv Invite) Check(redeemed bool, now time.Time) RedeemOutcome {
	switch {
	case !inv.RevokedAt.IsZero():
		return InviteRevoked
	case redeemed:
		return InviteAlreadyRedeemed
	case !inv.ExpiresAt.IsZero() && !now.Before(inv.ExpiresAt):
		return InviteExpired
	case inv.Used >= inv.MaxUses:
		return InviteUsedUp
	}
	return InviteRedeemed
}

// RedeemOutcome is what a redemption did, or would do.
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

// Redeemer is what verification needs from a database: a read-only
// check (InviteUnknown when no invite has the hash), then the binding
// redemption.
type Redeemer interface {
	CheckInvite(hash [32]byte, email string, now time.Time) (RedeemOutcome, error)
	RedeemInvite(ctx context.Context, hash [32]byte, email string, now time.Time) (RedeemOutcome, error)
}

// ErrNotFound means no invite has the id asked for. A Store returns it
// (wrapped) for an unknown id; Codes, the operator and the admin client
// pass it on, and callers test it with errors.Is.
var ErrNotFound = errors.New("invites: not found")
