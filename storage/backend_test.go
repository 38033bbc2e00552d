package storage

import (
	"testing"

	"breakwater/storage/backendtest"
)

// boltKit opens a fresh bolt file of the test's own for the suite both
// backends run.
func boltKit() backendtest.Kit {
	return backendtest.Kit{
		Open:                func(t *testing.T) backendtest.Backend { return mustOpen(t) },
		ErrExists:           ErrExists,
		ErrInvalid:          ErrInvalid,
		ErrInviteKeyChanged: ErrInviteKeyChanged,
		Redemptions: func(b backendtest.Backend, hash [32]byte) ([]backendtest.Redemption, error) {
			reds, err := b.(*DB).Redemptions(hash)
			out := make([]backendtest.Redemption, 0, len(reds))
			for _, r := range reds {
				out = append(out, backendtest.Redemption(r))
			}
			return out, err
		},
		Another:   func(_ *testing.T, b backendtest.Backend) backendtest.Backend { return b },
		EventPage: eventPage,
		PrunePage: prunePage,
	}
}

func TestBackendKeys(t *testing.T)      { backendtest.Keys(t, boltKit()) }
func TestBackendPersonal(t *testing.T)  { backendtest.Personal(t, boltKit()) }
func TestBackendRekey(t *testing.T)     { backendtest.Rekey(t, boltKit()) }
func TestBackendEvents(t *testing.T)    { backendtest.Events(t, boltKit()) }
func TestBackendDetection(t *testing.T) { backendtest.Detection(t, boltKit()) }
func TestBackendInvites(t *testing.T)   { backendtest.Invites(t, boltKit()) }
