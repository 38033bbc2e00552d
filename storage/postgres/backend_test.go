package postgres_test

import (
	"sync"
	"testing"

	"breakwater/storage/backendtest"
	"breakwater/storage/postgres"
)

// pgKit opens a fresh database of the test's own (migratedDatabase)
// for the suite both backends run.
func pgKit() backendtest.Kit {
	var mu sync.Mutex
	urls := map[backendtest.Backend]string{}
	return backendtest.Kit{
		Open: func(t *testing.T) backendtest.Backend {
			url := migratedDatabase(t)
			db := open(t, url)
			mu.Lock()
			defer mu.Unlock()
			urls[db] = url
			return db
		},
		ErrExists:           postgres.ErrExists,
		ErrInvalid:          postgres.ErrInvalid,
		ErrInviteKeyChanged: postgres.ErrInviteKeyChanged,
		Redemptions: func(b backendtest.Backend, hash [32]byte) ([]backendtest.Redemption, error) {
			reds, err := b.(*postgres.DB).Redemptions(hash)
			out := make([]backendtest.Redemption, 0, len(reds))
			for _, r := range reds {
				out = append(out, backendtest.Redemption(r))
			}
			return out, err
		},
		Another: func(t *testing.T, b backendtest.Backend) backendtest.Backend {
			mu.Lock()
			url := urls[b]
			mu.Unlock()
			return open(t, url)
		},
		EventPage: 1024,  // EachEvent's page
		PrunePage: 10000, // PruneEvents's batch
	}
}

func TestBackendKeys(t *testing.T) {
	t.Parallel()
	backendtest.Keys(t, pgKit())
}

func TestBackendPersonal(t *testing.T) {
	t.Parallel()
	backendtest.Personal(t, pgKit())
}

func TestBackendRekey(t *testing.T) {
	t.Parallel()
	backendtest.Rekey(t, pgKit())
}

func TestBackendEvents(t *testing.T) {
	t.Parallel()
	backendtest.Events(t, pgKit())
}

func TestBackendDetection(t *testing.T) {
	t.Parallel()
	backendtest.Detection(t, pgKit())
}

func TestBackendInvites(t *testing.T) {
	t.Parallel()
	backendtest.Invites(t, pgKit())
}
