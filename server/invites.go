package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"breakwater/server/keys"
	"breakwater/storage"
)

// Invite codes are inviteCodeLen characters of inviteAlphabet from
// crypto/rand, printed in groups of four ("7KQM-X3HD-9RWN"): about 59 bits.
// The alphabet leaves out 0, 1, I, L and O, which are easily misread.
// Guessing is held off by the fail limit, not by length alone.
const (
	inviteAlphabet = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"
	inviteCodeLen  = 12
	inviteGroup    = 4
	maxInviteUses  = 1_000_000
	maxNoteLen     = 200
	maxEmailLen    = 254
)

// Errors of invite management.
var (
	// ErrBadInvite refuses an invite with fewer than 1 or more than a
	// million uses, a negative expiry, or a note longer than 200 bytes or
	// holding control characters.
	ErrBadInvite = errors.New("server: an invite needs 1 to 1000000 uses, an expiry of 0 (never) or more, and a note of at most 200 printable bytes")
)

// InviteInfo describes an invite without its code, which is never stored.
type InviteInfo struct {
	ID        string    `json:"id"`
	Uses      int       `json:"uses"`
	MaxUses   int       `json:"max_uses"`
	Note      string    `json:"note,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// InviteStore is what invites need from storage.
type InviteStore interface {
	CreateInvite(inv storage.Invite) error
	Invites() ([]storage.Invite, error)
	RevokeInvite(id string, at time.Time) (storage.Invite, error)
	DeleteInvite(id string) (storage.Invite, error)
}

// InviteRedeemer is what verification needs from storage: a read-only
// check (InviteUnknown when no invite has the hash), then the binding
// redemption.
type InviteRedeemer interface {
	CheckInvite(hash [32]byte, email string, now time.Time) (storage.RedeemOutcome, error)
	RedeemInvite(ctx context.Context, hash [32]byte, email string, now time.Time) (storage.RedeemOutcome, error)
}

// Invites creates, lists and revokes invite codes in storage. Unlike the
// keyring it keeps nothing in memory: every verification reads storage.
type Invites struct {
	store InviteStore
	now   func() time.Time
}

// NewInvites returns invite management over store.
func NewInvites(store InviteStore) (*Invites, error) {
	if store == nil {
		return nil, errors.New("server: invites need a store")
	}
	return &Invites{store: store, now: time.Now}, nil
}

// Create makes an invite for uses different e-mails (0 means 1), valid for
// ttl (0: no expiry), and returns its code, which is shown once and never
// stored.
func (iv *Invites) Create(uses int, ttl time.Duration, note string) (code string, info InviteInfo, err error) {
	if uses == 0 {
		uses = 1
	}
	if uses < 0 || uses > maxInviteUses || ttl < 0 || len(note) > maxNoteLen || !printable(note) {
		return "", InviteInfo{}, ErrBadInvite
	}
	code = newInviteCode()
	now := iv.now().UTC()
	inv := storage.Invite{
		ID: "inv_" + keys.RandomString(10, keys.Base62), Hash: hashInviteCode(normaliseCode(code)),
		MaxUses: uses, Note: note, CreatedAt: now,
	}
	if ttl > 0 {
		inv.ExpiresAt = now.Add(ttl)
	}
	if err := iv.store.CreateInvite(inv); err != nil {
		return "", InviteInfo{}, fmt.Errorf("create invite: %w", err)
	}
	return code, inviteInfo(inv), nil
}

// List describes every invite, oldest first, without codes.
func (iv *Invites) List() ([]InviteInfo, error) {
	list, err := iv.store.Invites()
	if err != nil {
		return nil, err
	}
	out := make([]InviteInfo, 0, len(list))
	for _, inv := range list {
		out = append(out, inviteInfo(inv))
	}
	return out, nil
}

// Revoke disables an invite at once; e-mails that redeemed it before keep
// nothing from it here (the caller's sign-up decides what a redemption
// gave them).
func (iv *Invites) Revoke(id string) (InviteInfo, error) {
	inv, err := iv.store.RevokeInvite(id, iv.now().UTC())
	if err != nil {
		return InviteInfo{}, err
	}
	return inviteInfo(inv), nil
}

// Delete removes an invite and the e-mails that redeemed it, for an
// operator who must erase them; its code is refused from then on, as an
// unknown one. Revoke keeps the record.
func (iv *Invites) Delete(id string) (InviteInfo, error) {
	inv, err := iv.store.DeleteInvite(id)
	if err != nil {
		return InviteInfo{}, err
	}
	return inviteInfo(inv), nil
}

func inviteInfo(inv storage.Invite) InviteInfo {
	return InviteInfo{
		ID: inv.ID, Uses: inv.Used, MaxUses: inv.MaxUses, Note: inv.Note,
		CreatedAt: inv.CreatedAt, ExpiresAt: inv.ExpiresAt, RevokedAt: inv.RevokedAt,
	}
}

// newInviteCode draws a code uniformly from inviteAlphabet with
// crypto/rand and groups it for reading.
func newInviteCode() string {
	const n = len(inviteAlphabet)
	const limit = 256 - 256%n // rejection sampling keeps the draw uniform
	raw := make([]byte, 0, inviteCodeLen)
	buf := make([]byte, 2*inviteCodeLen)
	for len(raw) < inviteCodeLen {
		_, _ = rand.Read(buf) // crypto/rand.Read never fails on supported platforms
		for _, b := range buf {
			if int(b) >= limit || len(raw) == inviteCodeLen {
				continue
			}
			raw = append(raw, inviteAlphabet[int(b)%n])
		}
	}
	var sb strings.Builder
	for i, c := range raw {
		if i > 0 && i%inviteGroup == 0 {
			sb.WriteByte('-')
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

// normaliseCode returns the canonical form of a submitted code: separators
// (spaces, tabs, hyphens) removed and ASCII letters upper-cased. Anything
// else is kept as it is, so a malformed code stays malformed and merely
// finds no invite. It never fails, so that every submission is hashed the
// same way.
func normaliseCode(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '-' || r == ' ' || r == '\t':
			return -1
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		}
		return r
	}, s)
}

// wellFormedCode reports whether a normalised code could be one of ours.
func wellFormedCode(code string) bool {
	if len(code) != inviteCodeLen {
		return false
	}
	for i := range len(code) {
		if strings.IndexByte(inviteAlphabet, code[i]) < 0 {
			return false
		}
	}
	return true
}

// hashInviteCode is the storage key of a normalised code.
func hashInviteCode(code string) [32]byte { return sha256.Sum256([]byte(code)) }

// normaliseEmail trims and lower-cases an e-mail address and checks it
// loosely: valid UTF-8 of at most 254 bytes, exactly one "@" with
// something on each side, no spaces or control characters. It does not
// try to decide deliverability.
func normaliseEmail(s string) (string, bool) {
	e := strings.ToLower(strings.TrimSpace(s))
	if e == "" || len(e) > maxEmailLen || !utf8.ValidString(e) || strings.Count(e, "@") != 1 {
		return "", false
	}
	local, domain, _ := strings.Cut(e, "@")
	if local == "" || domain == "" {
		return "", false
	}
	for _, r := range e {
		if unicode.IsControl(r) || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return "", false
		}
	}
	return e, true
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
