package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// hookLog is a webhook receiver (the json format) on 127.0.0.1 that keeps
// the kinds it is sent, in the order they arrive.
type hookLog struct {
	*httptest.Server
	mu    sync.Mutex
	kinds []string
	got   chan struct{} // a notice arrived
}

func newHookLog(t *testing.T) *hookLog {
	h := &hookLog{got: make(chan struct{}, 100)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n detect.JSONNotice
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		h.mu.Lock()
		h.kinds = append(h.kinds, n.Kind)
		h.mu.Unlock()
		h.got <- struct{}{}
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookLog) received() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.kinds)
}

// waitFor waits until the receiver holds n notices, or timeout has passed
// (then fails t).
func (h *hookLog) waitFor(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for len(h.received()) < n {
		select {
		case <-h.got:
		case <-deadline:
			t.Fatalf("the webhook got %v within %s, want %d notices", h.received(), timeout, n)
		}
	}
}

// slowGemini is a fake generateContent that takes latency to answer, so
// that a burst's reads are in flight together.
func slowGemini(t *testing.T, latency time.Duration) *httptest.Server {
	g := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(latency)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":0,"totalTokenCount":322}}`)
	}))
	t.Cleanup(g.Close)
	return g
}

// burstConfig is a config.toml of daily_requests = 20, warnings at 50%
// and 80%, every alert to the json webhook of $HOOK_URL.
func burstConfig(storage, baseURL string) string {
	return fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
max_in_flight_per_user = 64
%s
[ocr]
base_url = %q
dedupe_window = "0s"
[budget]
daily_requests = 20
[limits.user]
rate = 100000
burst = 1000
[plans.free]
monthly_quota = 1000
[alerts]
warn_at = [0.5, 0.8]
[[alerts.webhook]]
format = "json"
url_env = "HOOK_URL"
`, storage, baseURL)
}

// The runaway case, on both backends: 30 reads at once against
// daily_requests = 20. The webhook gets the 50% and the 80% warnings, then
// brake_engaged, in that order and within seconds (not on the 15 s poll,
// which would come after the brake), each once.
func TestEarlyWarningsBeforeTheBrakeInABurst(t *testing.T) {
	for _, backend := range []string{"bolt", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			hook := newHookLog(t)
			vars := map[string]string{"GEMINI_API_KEY": "test-key", "HOOK_URL": hook.URL,
				"BREAKWATER_SECRET": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}
			storage := fmt.Sprintf("[storage]\npath = %q", filepath.Join(t.TempDir(), "bw.db"))
			if backend == "postgres" {
				vars[postgres.EnvURL] = pgtest.NewDatabase(t)
				storage = "[storage]\nbackend = \"postgres\""
			}
			cfg, err := Load(writeConfig(t, burstConfig(storage, slowGemini(t, 20*time.Millisecond).URL)), env(vars))
			if err != nil {
				t.Fatal(err)
			}
			a, err := Open(context.Background(), cfg, Options{Getenv: env(vars), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			key, _, err := a.Keys().Create("ann", "free")
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			statuses := burstReads(t, a, key, 30)
			if ok := statuses[http.StatusOK]; ok != 20 {
				t.Errorf("%d reads answered 200 (%v), want the 20 the ceiling allows", ok, statuses)
			}
			hook.waitFor(t, 3, 5*time.Second)
			t.Logf("%v; three notices within %s", statuses, time.Since(start).Round(time.Millisecond))
			a.Close() // delivers anything still queued
			want := []string{"budget_warn_daily_requests_50", "budget_warn_daily_requests_80", detect.KindBrakeEngaged}
			if got := hook.received(); !slices.Equal(got, want) {
				t.Errorf("the webhook got %s, want %s", strings.Join(got, " "), strings.Join(want, " "))
			}
		})
	}
}

// burstReads sends n reads of distinct images at once and counts the
// answers by status.
func burstReads(t *testing.T, a *App, key string, n int) map[int]int {
	statuses := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		img := grayPNG(t, uint8(i))
		wg.Go(func() {
			<-start
			res := postOCR(t, a, key, fmt.Sprintf("burst-%d", i), img)
			mu.Lock()
			statuses[res.status]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return statuses
}
