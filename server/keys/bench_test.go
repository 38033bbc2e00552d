package keys_test

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"breakwater/budget"
	"breakwater/server/keys"
	"breakwater/storage"
)

// newBenchKeyring is a keyring over a real database (without fsync) with
// n keys, one per user, and their secrets.
func newBenchKeyring(tb testing.TB, n int) (*keys.Keyring, []string) {
	tb.Helper()
	db, err := storage.Open(filepath.Join(tb.TempDir(), "bw.db"), storage.Options{NoSync: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	plans := keys.NewPlans(map[string]budget.Plan{"free": {MonthlyQuota: 100}, "pro": {MonthlyQuota: 1000}})
	k, err := keys.NewKeyring(db, plans.Has, keys.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	secrets := make([]string, n)
	for i := range secrets {
		if secrets[i], _, err = k.Create(fmt.Sprintf("user-%06d", i), ""); err != nil {
			tb.Fatal(err)
		}
	}
	return k, secrets
}

// BenchmarkAuthenticate is the keyring's part of every request: a known
// key, and a well-formed key that is none (the flood of random keys).
func BenchmarkAuthenticate(b *testing.B) {
	k, secrets := newBenchKeyring(b, 1000)
	b.Run("known", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, _, ok := k.Authenticate(secrets[i%len(secrets)]); !ok {
				b.Fatal("refused")
			}
			i++
		}
	})
	b.Run("unknown", func(b *testing.B) {
		b.ReportAllocs()
		unknown := keys.KeyPrefix + keys.RandomString(keys.KeySecretLen, keys.Base62)
		for b.Loop() {
			if _, _, ok := k.Authenticate(unknown); ok {
				b.Fatal("accepted")
			}
		}
	})
}

// TestAuthenticateAllocatesNothing: the identity's strings are the
// keyring's own, so a request's authentication allocates nothing, known
// key or not.
func TestAuthenticateAllocatesNothing(t *testing.T) {
	k, secrets := newBenchKeyring(t, 10)
	unknown := keys.KeyPrefix + keys.RandomString(keys.KeySecretLen, keys.Base62)
	for _, tt := range []struct {
		name, token string
		ok          bool
	}{
		{"known", secrets[3], true},
		{"unknown", unknown, false},
		{"malformed", "bw_short", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(100, func() {
				if _, _, ok := k.Authenticate(tt.token); ok != tt.ok {
					t.Fatalf("ok %v, want %v", ok, tt.ok)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations per call, want 0", allocs)
			}
		})
	}
}
