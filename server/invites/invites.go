// Package invites provides invite codes and the protections of their
// verification: Codes creates, lists, revokes and deletes invites in
// storage (a code is shown once and only its keyed hash is kept, see Key), Limits holds
// the per-IP rate windows and the fail limits in memory, and the
// normalisation every submitted code and e-mail goes through before it is
// hashed or counted. It knows no HTTP: the transport's handler walks the
// protections in order and answers.
package invites

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"breakwater/server/keys"
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
	// ErrInvalid refuses an invite with fewer than 1 or more than a
	// million uses, a negative expiry, or a note longer than 200 bytes or
	// holding control characters.
	ErrInvalid = errors.New("server: an invite needs 1 to 1000000 uses, an expiry of 0 (never) or more, and a note of at most 200 printable bytes")
)

// Info describes an invite without its code, which is never stored.
type Info struct {
	ID        string    `json:"id"`
	Uses      int       `json:"uses"`
	MaxUses   int       `json:"max_uses"`
	Note      string    `json:"note,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// Store is what Codes need from a database.
type Store interface {
	CreateInvite(inv Invite) error
	Invites() ([]Invite, error)
	RevokeInvite(id string, at time.Time) (Invite, error)
	DeleteInvite(id string) (Invite, error)
}

// Options are the optional dependencies of Codes.
type Options struct {
	// Now is the clock of creation, expiry and revocation times. Nil:
	// time.Now.
	Now func() time.Time
	// Key hashes the codes for storage. Required.
	Key *Key
}

// Codes creates, lists and revokes invite codes in storage. Unlike the
// keyring it keeps nothing in memory: every verification reads storage.
type Codes struct {
	store Store
	key   *Key
	now   func() time.Time
}

// NewCodes returns invite management over store.
func NewCodes(store Store, o Options) (*Codes, error) {
	if store == nil {
		return nil, errors.New("invites: codes need a store")
	}
	if o.Key == nil {
		return nil, errors.New("invites: codes need a key")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Codes{store: store, key: o.Key, now: o.Now}, nil
}

// Create makes an invite for uses different e-mails (0 means 1), valid for
// ttl (0: no expiry), and returns its code, which is shown once and never
// stored.
func (iv *Codes) Create(uses int, ttl time.Duration, note string) (code string, info Info, err error) {
	if uses == 0 {
		uses = 1
	}
	if uses < 0 || uses > maxInviteUses || ttl < 0 || len(note) > maxNoteLen || !printable(note) {
		return "", Info{}, ErrInvalid
	}
	code = NewCode()
	now := iv.now().UTC()
	inv := Invite{
		ID: "inv_" + keys.RandomString(10, keys.Base62), Hash: iv.key.Hash(NormaliseCode(code)),
		MaxUses: uses, Note: note, CreatedAt: now,
	}
	if ttl > 0 {
		inv.ExpiresAt = now.Add(ttl)
	}
	if err := iv.store.CreateInvite(inv); err != nil {
		return "", Info{}, fmt.Errorf("create invite: %w", err)
	}
	return code, describe(inv), nil
}

// List describes every invite, oldest first, without codes.
func (iv *Codes) List() ([]Info, error) {
	list, err := iv.store.Invites()
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(list))
	for _, inv := range list {
		out = append(out, describe(inv))
	}
	return out, nil
}

// Revoke disables an invite at once; e-mails that redeemed it before keep
// nothing from it here (the caller's sign-up decides what a redemption
// gave them).
func (iv *Codes) Revoke(id string) (Info, error) {
	inv, err := iv.store.RevokeInvite(id, iv.now().UTC())
	if err != nil {
		return Info{}, err
	}
	return describe(inv), nil
}

// Delete removes an invite and the e-mails that redeemed it, for an
// operator who must erase them; its code is refused from then on, as an
// unknown one. Revoke keeps the record.
func (iv *Codes) Delete(id string) (Info, error) {
	inv, err := iv.store.DeleteInvite(id)
	if err != nil {
		return Info{}, err
	}
	return describe(inv), nil
}

func describe(inv Invite) Info {
	return Info{
		ID: inv.ID, Uses: inv.Used, MaxUses: inv.MaxUses, Note: inv.Note,
		CreatedAt: inv.CreatedAt, ExpiresAt: inv.ExpiresAt, RevokedAt: inv.RevokedAt,
	}
}

// NewCode draws a code uniformly from the invite alphabet with
// crypto/rand and groups it for reading.
func NewCode() string {
	raw := keys.RandomString(inviteCodeLen, inviteAlphabet)
	var sb strings.Builder
	for i := range len(raw) {
		if i > 0 && i%inviteGroup == 0 {
			sb.WriteByte('-')
		}
		sb.WriteByte(raw[i])
	}
	return sb.String()
}

// NormaliseCode returns the canonical form of a submitted code: separators
// (spaces, tabs, hyphens) removed and ASCII letters upper-cased. Anything
// else is kept as it is, so a malformed code stays malformed and merely
// finds no invite. It never fails, so that every submission is hashed the
// same way.
func NormaliseCode(s string) string {
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

// WellFormed reports whether a normalised code could be one of ours.
func WellFormed(code string) bool {
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

// NormaliseEmail trims and lower-cases an e-mail address and checks it
// loosely: valid UTF-8 of at most 254 bytes, exactly one "@" with
// something on each side, no spaces or control characters. It does not
// try to decide deliverability.
func NormaliseEmail(s string) (string, bool) {
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
