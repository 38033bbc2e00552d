package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage"
	"breakwater/test/harness"
)

// TestCrashKeepsReservation kills the server (SIGKILL) while an upstream
// call is in flight, after its budget reservation was committed and before
// it was settled. After a restart the reservation still counts: with a
// ceiling of one call a day, the next request is refused without an
// upstream call. The server is the binary built from the module's root.
func TestCrashKeepsReservation(t *testing.T) {
	t.Parallel() // its binary, fake and database of its own
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var calls atomic.Int64
	called := make(chan struct{}, 10)
	release := make(chan struct{})
	gemini := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		called <- struct{}{}
		select { // hold the first call until the server is dead
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer gemini.Close()
	defer close(release)

	dir := t.TempDir()
	bin, err := harness.Build(ctx, ".", dir)
	if err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(dir, "bw.db")
	config := filepath.Join(dir, "config.toml")
	if err := harness.WriteConfig(config, harness.Config{DBPath: dbPath, GeminiURL: gemini.URL, DailyRequests: 1, Plan: "free"}); err != nil {
		t.Fatal(err)
	}
	key, err := harness.CreateKey(ctx, bin, config, "crash", "free")
	if err != nil {
		t.Fatal(err)
	}

	p, err := harness.Start(bin, config, filepath.Join(dir, "first.log"), "GEMINI_API_KEY=test-key")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	img := harness.PNG()
	client := &http.Client{Timeout: 30 * time.Second}
	go harness.Post(ctx, client, p.Addr, key, img) // its answer never comes: the server dies
	select {
	case <-called:
	case <-time.After(15 * time.Second):
		t.Fatalf("the upstream was never called; log:\n%s", harness.Tail(p.LogPath))
	}
	p.Kill()
	if !p.Killed() {
		t.Fatalf("the server was not killed; log:\n%s", harness.Tail(p.LogPath))
	}

	db, err := storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	today := budget.DayKey(time.Now(), time.UTC)
	day, _ := db.Budget(today)
	open, _ := db.OpenReservations()
	db.Close()
	if day.Requests != 1 || day.SpendMicroUSD <= 0 || open != 0 {
		t.Fatalf("after the crash: %+v with %d open reservation rows; want 1 request at its worst case (a lease of one call, which keeps no row)", day, open)
	}

	// Restart: the reservation made before the crash still counts.
	again, err := harness.Start(bin, config, filepath.Join(dir, "second.log"), "GEMINI_API_KEY=test-key")
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop(10 * time.Second)
	a := harness.Post(ctx, client, again.Addr, key, img)
	if a.Err != nil {
		t.Fatal(a.Err)
	}
	if a.Status != http.StatusServiceUnavailable || a.Code != "budget_paused" {
		t.Errorf("after restart: %d %s, want 503 budget_paused", a.Status, a.Code)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
}
