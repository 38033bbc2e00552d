package cli_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage"
)

// A flood of 20,000 requests refused by the rate limit, sent within a few
// seconds, writes a bounded number of statistics rows (one per minute and
// key, plus any row of lost events), and those rows still account for
// every refusal.
func TestFloodOfRefusalsWritesBoundedRows(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of 20,000 requests")
	}
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "bw.db")
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[storage]
path = %q
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
[limits.user]
rate = 1
window = "1h"
burst = 0
`, dbPath))
	key := createKey(t, path, "flood")
	a, _, stop := startApp(t, path, envFrom(nil))
	img := samplePNG(t)
	if status, body, err := postImage(a.Addr(), key, img); err != nil || status != http.StatusOK {
		t.Fatalf("first request: %d %s %v", status, body, err)
	}

	const flood, workers = 20_000, 16
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 10 * time.Second}
	var next, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= flood {
				req, _ := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/v1/ocr", bytes.NewReader(img))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "image/png")
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if refused.Load() != flood {
		t.Fatalf("%d of %d refused", refused.Load(), flood)
	}
	stop() // flushes the tally

	db, err := storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	events, err := db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var counted, lost int64
	for _, e := range events {
		switch e.Outcome {
		case detect.OutcomeLayerRefused:
			if e.Layer != "rate" || e.UserID != "flood" || e.Route != "/v1/ocr" {
				t.Errorf("refusal row %+v", e)
			}
			counted += e.N()
		case detect.OutcomeDropped:
			lost += e.N()
		}
	}
	if counted+lost != flood {
		t.Errorf("rows account for %d refused + %d lost = %d, want %d", counted, lost, counted+lost, flood)
	}
	// One row per minute the flood spanned (and one more for a minute
	// boundary), the first request's event, and a few of lost events.
	bound := 2*(int(took/time.Minute)+2) + 1
	if len(events) > bound {
		t.Errorf("%d rows for %d refusals in %s, want at most %d", len(events), flood, took.Round(time.Millisecond), bound)
	}
	t.Logf("%d refusals in %s: %d rows (%d refusals counted, %d lost)", flood, took.Round(time.Millisecond), len(events), counted, lost)
}
