package keys_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/server/keys"
	"breakwater/storage"
)

// newTestKeyring is a keyring over a real database with plans free and pro.
func newTestKeyring(t *testing.T) *keys.Keyring {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	plans := keys.NewPlans(map[string]budget.Plan{"free": {MonthlyQuota: 100}, "pro": {MonthlyQuota: 1000}})
	k, err := keys.NewKeyring(db, plans.Has, keys.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyringCreate(t *testing.T) {
	k := newTestKeyring(t)
	cases := []struct {
		name, user, plan string
		wantPlan         string
		wantErr          error
	}{
		{"new user gets free", "u1", "", "free", nil},
		{"named plan", "u2", "pro", "pro", nil},
		{"existing user keeps plan", "u2", "", "pro", nil},
		{"unknown plan", "u3", "gold", "", keys.ErrUnknownPlan},
		{"empty id", "", "", "", keys.ErrBadUserID},
		{"control char", "a\nb", "", "", keys.ErrBadUserID},
		{"too long", strings.Repeat("x", 129), "", "", keys.ErrBadUserID},
		{"max length", strings.Repeat("x", 128), "", "free", nil},
		{"unicode ok", "josé@example.com", "", "free", nil},
		{"invalid utf8", "a\xffb", "", "", keys.ErrBadUserID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			secret, info, err := k.Create(c.user, c.plan)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("err %v, want %v", err, c.wantErr)
			}
			if err != nil {
				return
			}
			if info.Plan != c.wantPlan {
				t.Errorf("plan %q, want %q", info.Plan, c.wantPlan)
			}
			if !keys.ValidShape(secret) {
				t.Errorf("secret %q has the wrong shape", secret)
			}
			id, _, ok := k.Authenticate(secret)
			if !ok || id.UserID != c.user || id.Plan != c.wantPlan {
				t.Errorf("authenticate: %+v %v", id, ok)
			}
		})
	}
}

// TestKeyringSharedUser checks that every key of a user sees a change to
// the user at once: the keys point at one record.
func TestKeyringSharedUser(t *testing.T) {
	k := newTestKeyring(t)
	alice, _, err := k.Create("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	first, _, err := k.Create("u1", "")
	if err != nil {
		t.Fatal(err)
	}
	second, _, err := k.Create("u1", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.SetBanned("u1", true, false); err != nil {
		t.Fatal(err)
	}
	if _, err := k.SetPlan("u1", "pro"); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{first, second} {
		id, banned, ok := k.Authenticate(secret)
		if !ok || id.UserID != "u1" || id.Plan != "pro" || !banned {
			t.Errorf("authenticate: %+v banned %v ok %v, want u1 on pro, banned", id, banned, ok)
		}
	}
	if _, banned, ok := k.Authenticate(alice); !ok || banned {
		t.Errorf("another user's key: banned %v ok %v", banned, ok)
	}
}

func TestIsBase62(t *testing.T) {
	for b := range 256 {
		if got, want := keys.IsBase62(byte(b)), strings.IndexByte(keys.Base62, byte(b)) >= 0; got != want {
			t.Errorf("keys.IsBase62(%q) = %v, want %v", byte(b), got, want)
		}
	}
}

// TestRandomString: strings have the length asked for, only characters of
// the alphabet, never repeat, and every character of the alphabet turns
// up about as often as the others.
func TestRandomString(t *testing.T) {
	for _, tt := range []struct {
		name     string
		alphabet string
		n        int
	}{
		{"base62 secret", keys.Base62, keys.KeySecretLen},
		{"invite alphabet", "23456789ABCDEFGHJKMNPQRSTUVWXYZ", 12},
		{"hex", "0123456789abcdef", 12},
	} {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[string]bool{}
			counts := map[byte]int{}
			const draws = 2000
			for range draws {
				s := keys.RandomString(tt.n, tt.alphabet)
				if len(s) != tt.n || seen[s] {
					t.Fatalf("bad or repeated string %q", s)
				}
				seen[s] = true
				for i := range len(s) {
					if strings.IndexByte(tt.alphabet, s[i]) < 0 {
						t.Fatalf("%q holds %q, not in the alphabet", s, s[i])
					}
					counts[s[i]]++
				}
			}
			// Each character is expected draws*n/len(alphabet) times; a
			// biased draw (a modulo without rejection) would give the
			// first characters of a 62-letter alphabet 25% more.
			want := float64(draws*tt.n) / float64(len(tt.alphabet))
			for i := range len(tt.alphabet) {
				if got := float64(counts[tt.alphabet[i]]); got < want*0.8 || got > want*1.2 {
					t.Errorf("%q drawn %v times, want about %.0f", tt.alphabet[i], got, want)
				}
			}
		})
	}
}
