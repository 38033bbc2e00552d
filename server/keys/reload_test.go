package keys_test

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/server/keys"
	"breakwater/storage"
)

// heldStore is a real database whose key listing can be held once, after
// it has read the keys: a Reload caught between its read and its swap.
type heldStore struct {
	*storage.DB
	hold    chan struct{} // closed by the test to let the held read go on
	reading chan struct{} // closed when the held read has read
	once    sync.Once
	armed   bool
	mu      sync.Mutex
}

func (s *heldStore) Keys() ([]keys.Key, error) {
	list, err := s.DB.Keys()
	s.mu.Lock()
	armed := s.armed
	s.armed = false
	s.mu.Unlock()
	if armed {
		s.once.Do(func() { close(s.reading) })
		<-s.hold
	}
	return list, err
}

// A Reload whose read missed a key being created (or revoked) at the same
// time must not put its older view over the change: the key created works,
// the key revoked stays refused. (An instance on PostgreSQL reloads at each
// reconnection and every 30 s while keys change.)
func TestReloadKeepsChangesMadeMeanwhile(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store := &heldStore{DB: db, hold: make(chan struct{}), reading: make(chan struct{})}
	plans := keys.NewPlans(map[string]budget.Plan{"free": {MonthlyQuota: 100}})
	k, err := keys.NewKeyring(store, plans.Has, keys.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old, oldInfo, err := k.Create("ann", "free")
	if err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.armed = true
	store.mu.Unlock()
	reloaded := make(chan error, 1)
	go func() { reloaded <- k.Reload() }()
	<-store.reading // the reload has read the keys: ann's old key, active
	var fresh string
	changed := make(chan error, 1)
	go func() {
		var err error
		if fresh, _, err = k.Create("bob", "free"); err == nil {
			_, err = k.Revoke(oldInfo.ID)
		}
		changed <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the changes run, or wait for the reload
	close(store.hold)
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	if _, _, ok := k.Authenticate(fresh); !ok {
		t.Error("the key created during the reload is refused: the reload's older view replaced it")
	}
	if _, _, ok := k.Authenticate(old); ok {
		t.Error("the key revoked during the reload still works: the reload's older view brought it back")
	}
}
