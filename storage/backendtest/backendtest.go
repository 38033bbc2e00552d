// Package backendtest is the behaviour every storage backend owes, as one
// suite: the bolt backend (storage) and the PostgreSQL one
// (storage/postgres) run it from their tests, each with its own opener.
// It drives a backend only through the interfaces of docs/DESIGN.md
// "What a storage backend implements" and the few methods the wiring
// needs besides; what is one backend's own (bolt's file damage and bucket
// migrations, PostgreSQL's instances sharing a database) stays in that
// backend's tests. Only tests import it.
package backendtest

import (
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/server/invites"
	"breakwater/server/keys"
)

// Backend is what the suite drives.
type Backend interface {
	keys.KeyStore
	invites.Store
	invites.Redeemer
	detect.Store
	detect.EventWriter
	detect.PersonalPruner
	detect.AlertStore
	// Events returns the events from from (inclusive) to to (exclusive;
	// zero: no bound), oldest first, in the order appended.
	Events(from, to time.Time) ([]detect.Event, error)
	// InviteByHash returns the invite stored under hash, or an error
	// that is invites.ErrNotFound.
	InviteByHash(hash [32]byte) (invites.Invite, error)
	// RekeyInvites moves every invite to its keyed hash once per mark.
	RekeyInvites(mark []byte, rekey func(digest [32]byte) [32]byte) (int, error)
}

// Redemption is one e-mail's use of an invite, as the suite compares it.
type Redemption struct {
	Email string
	At    time.Time
}

// Kit tells the suite how to open a fresh, empty backend of the test's
// own (closed when the test ends), and what the interfaces leave to each
// backend: its sentinels and its record of redemptions.
type Kit struct {
	Open func(t *testing.T) Backend
	// ErrExists and ErrInvalid are the backend's errors for a record
	// that already exists and for one the backend refuses.
	ErrExists, ErrInvalid error
	// ErrInviteKeyChanged is RekeyInvites's error for another mark.
	ErrInviteKeyChanged error
	// Redemptions lists the redemptions of the invite under hash, oldest
	// first.
	Redemptions func(b Backend, hash [32]byte) ([]Redemption, error)
	// Another opens another handle on b's records, as a second instance
	// of the service would (bolt, one process per file: b itself).
	Another func(t *testing.T, b Backend) Backend
	// EventPage is how many events EachEvent reads at once; PrunePage how
	// many PruneEvents deletes in one transaction.
	EventPage, PrunePage int
}

// t0 is the suite's fixed now.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
