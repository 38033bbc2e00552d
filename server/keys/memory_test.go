package keys_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/server/keys"
	"breakwater/storage"
)

// maxHeapPerKey bounds the live heap the keyring keeps per active key, one
// key per user as most users have. It holds the key's hash, its id, its
// user's id, plan and ban: what authentication needs. The keyring measured
// about 195 B; the bound leaves headroom for Go's map growth without
// letting the listing records (about 390 B before) come back.
const maxHeapPerKey = 256

// TestKeyringHeapPerKey loads 100,000 keys (one per user) from a real
// database through keys.NewKeyring and bounds the live heap it keeps per key,
// measured after a collection before and after the load. Under the race
// detector, where writing them would take over a minute, it loads 10,000.
func TestKeyringHeapPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 keys")
	}
	n := 100_000
	if raceEnabled {
		n = 10_000
	}
	path := filepath.Join(t.TempDir(), "bw.db")
	db, err := storage.Open(path, storage.Options{NoSync: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	created := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := range n {
		user := fmt.Sprintf("user-%06d", i)
		secret := fmt.Sprintf("bw_%032d", i)
		k := keys.Key{ID: fmt.Sprintf("key_%010d", i), Hash: sha256.Sum256([]byte(secret)), UserID: user, CreatedAt: created}
		if err := db.CreateKey(k, keys.User{ID: user, Plan: "free", CreatedAt: created}); err != nil {
			t.Fatal(err)
		}
	}
	plans := keys.NewPlans(map[string]budget.Plan{"free": {MonthlyQuota: 100}})

	before := liveHeap()
	k, err := keys.NewKeyring(db, plans.Has, keys.Options{})
	if err != nil {
		t.Fatal(err)
	}
	after := liveHeap()
	perKey := float64(after-before) / float64(n)
	t.Logf("keyring: %.0f B of live heap per key (%d keys, %.1f MiB)", perKey, n, float64(after-before)/(1<<20))
	if perKey > maxHeapPerKey {
		t.Errorf("keyring keeps %.0f B per key, want at most %d", perKey, maxHeapPerKey)
	}
	if _, _, ok := k.Authenticate(fmt.Sprintf("bw_%032d", n-1)); !ok {
		t.Error("the last key does not authenticate")
	}
	runtime.KeepAlive(k)
}

// liveHeap is the heap in use once a collection has freed what is
// unreachable.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
