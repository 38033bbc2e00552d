package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/server/edge"
	"breakwater/server/edgetest"
	"breakwater/server/guard/state"
	"breakwater/storage"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// postParallel sends n requests at once, spread over keys, and counts
// answers by status.
func (e *env) postParallel(keys []string, n int) map[int]int {
	e.t.Helper()
	img := pngBytes(e.t, 16, 16)
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, data := e.post(keys[i%len(keys)], "image/png", img)
			if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
				if resp.Header.Get("Retry-After") == "" {
					e.t.Errorf("%d without Retry-After: %s", resp.StatusCode, data)
				}
			}
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return statuses
}

func TestGlobalDailyRequestsNeverOvershot(t *testing.T) {
	e := newEnv(t, envOptions{quota: 1000, budget: budget.Config{DailyRequests: 30},
		cfg: func(c *edge.Config) { c.MaxInFlightPerUser = 300 }}) // 30 at once per key: the brake's race, not the in-flight cap
	keys := []string{e.key}
	for i := range 9 {
		keys = append(keys, e.newKey(fmt.Sprintf("user-%d", i), ""))
	}
	got := e.postParallel(keys, 300)
	if calls := e.gemini.calls.Load(); calls > 30 {
		t.Errorf("%d upstream calls, want at most 30", calls)
	}
	if got[200] < 25 || got[200]+got[503] != 300 {
		t.Errorf("statuses %v: want at least 25 × 200 and the rest 503", got)
	}
	day, err := e.db.Budget(budget.DayKey(e.now, e.loc))
	if err != nil {
		t.Fatal(err)
	}
	if day.Requests > 30 {
		t.Errorf("ledger holds %d requests, want at most 30", day.Requests)
	}
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	p := edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
	// A ceiling on requests, not money, and without its figure.
	if !strings.Contains(p.Detail, "ceiling on requests for today") || strings.Contains(p.Detail, "spending") || strings.Contains(p.Detail, "30") {
		t.Errorf("detail %q, want it to name the ceiling on requests, not a spending limit, and no figure", p.Detail)
	}
}

func TestDailyLineCountsFailedAttempts(t *testing.T) {
	e := newEnv(t, envOptions{attempts: 5})
	e.gemini.set(func(w http.ResponseWriter, r *http.Request) { writeUpstreamError(w, 500, "INTERNAL") })
	statuses := map[int]int{}
	var last []byte
	for range 9 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		statuses[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "daily_limit")
			ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			if ra < 1 || ra > 86400 {
				t.Errorf("Retry-After %d, want until midnight", ra)
			}
			last = data
		}
	}
	if got := e.gemini.calls.Load(); got != 5 {
		t.Errorf("%d upstream calls, want 5", got)
	}
	if statuses[502] != 5 || statuses[429] != 4 {
		t.Errorf("statuses %v, want 5 × 502 and 4 × 429", statuses)
	}
	if strings.Contains(string(last), "5") {
		t.Errorf("the line's figure shows in %s", last)
	}
	// Invalid input is not an attempt: it never reaches the line's count.
	e2 := newEnv(t, envOptions{attempts: 1})
	for range 3 {
		resp, data := e2.post(e2.key, "image/gif", []byte("GIF89a"))
		edgetest.DecodeProblem(t, resp, data, http.StatusUnsupportedMediaType, "unsupported_media_type")
	}
	resp, data := e2.post(e2.key, "image/png", pngBytes(t, 16, 16))
	decodeOK(t, resp, data)
}

func TestRateLimitAndBurst(t *testing.T) {
	clk := newClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now, limits: limiter.Config{Rate: 5, Window: time.Minute}})
	statuses := map[int]int{}
	for i := range 12 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		statuses[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
			// The first request, at second 0, leaves the window at second 60.
			if got, want := resp.Header.Get("Retry-After"), strconv.Itoa(60-i); got != want {
				t.Errorf("request %d: Retry-After %q, want %s", i, got, want)
			}
		}
		clk.add(time.Second)
	}
	if statuses[200] != 5 || statuses[429] != 7 {
		t.Errorf("statuses %v, want 5 × 200 and 7 × 429", statuses)
	}
	if got := e.gemini.calls.Load(); got != 5 {
		t.Errorf("%d upstream calls, want 5", got)
	}
	// A minute after the first request, its slot frees.
	clk.set(time.Date(2026, 11, 30, 12, 1, 0, 0, time.UTC))
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	decodeOK(t, resp, data)

	burst := newEnv(t, envOptions{clock: clk.now, limits: limiter.Config{Burst: 2}})
	got := burst.postParallel([]string{burst.key}, 10)
	if got[200] > 2 || got[200]+got[429] != 10 {
		t.Errorf("burst statuses %v, want at most 2 × 200", got)
	}
}

func TestDailyUSDSettlesToActualTokens(t *testing.T) {
	// The fake reports 298 prompt and 24 output tokens: 298×0.30 + 24×2.50
	// = 149.4 µ$, billed as 150. The default model (media_resolution
	// "high") counts any image as at most 1120 tokens: a worst case of
	// (1120+300) input and 256 output tokens, 1066 µ$. With 2000 µ$ a day,
	// a call fits while the spend is at most 934: seven calls, then the
	// brake.
	e := newEnv(t, envOptions{budget: budget.Config{DailyUSD: 0.002}})
	statuses := map[int]int{}
	for range 10 {
		resp, _ := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		statuses[resp.StatusCode]++
	}
	if statuses[200] != 7 || statuses[503] != 3 {
		t.Errorf("statuses %v, want 7 × 200 then 3 × 503", statuses)
	}
	if got := e.gemini.calls.Load(); got != 7 {
		t.Errorf("%d upstream calls, want 7", got)
	}
	day, err := e.db.Budget(budget.DayKey(e.now, e.loc))
	if err != nil {
		t.Fatal(err)
	}
	if day.SpendMicroUSD != 1050 || day.Requests != 7 {
		t.Errorf("ledger %+v, want 7 requests and 1050 µ$", day)
	}
	if n, _ := e.db.OpenReservations(); n != 0 {
		t.Errorf("%d reservations left open", n)
	}
	if got := e.brake.Status(e.now).SpendMicroUSD; got != 1050 {
		t.Errorf("memory spend %d, want 1050", got)
	}
	// A failed call whose cost is unknown settles at its worst case.
	e2 := newEnv(t, envOptions{budget: budget.Config{DailyUSD: 1}})
	e2.gemini.set(func(w http.ResponseWriter, r *http.Request) { writeUpstreamError(w, 500, "INTERNAL") })
	resp, data := e2.post(e2.key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
	if err := e2.brake.Close(t.Context()); err != nil { // the lease's unused calls given back
		t.Fatal(err)
	}
	day, _ = e2.db.Budget(budget.DayKey(e2.now, e2.loc))
	if day.SpendMicroUSD != 1066 {
		t.Errorf("failed call spend %d, want the worst case 1066", day.SpendMicroUSD)
	}
	// So does a successful call whose reply reports no usage, or counts
	// that read as none: otherwise such replies would cost $0 for ever.
	for _, usage := range []map[string]any{nil, {"promptTokenCount": -5, "candidatesTokenCount": -1, "totalTokenCount": -6}} {
		e3 := newEnv(t, envOptions{budget: budget.Config{DailyUSD: 1}})
		e3.gemini.set(func(w http.ResponseWriter, r *http.Request) {
			body := map[string]any{
				"candidates": []any{map[string]any{
					"content":      map[string]any{"role": "model", "parts": []any{map[string]any{"text": `{"serials":["SN-12345"]}`}}},
					"finishReason": "STOP",
				}},
			}
			if usage != nil {
				body["usageMetadata"] = usage
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(body)
		})
		resp, data := e3.post(e3.key, "image/png", pngBytes(t, 16, 16))
		decodeOK(t, resp, data)
		if err := e3.brake.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		day, _ = e3.db.Budget(budget.DayKey(e3.now, e3.loc))
		if day.SpendMicroUSD != 1066 || e3.brake.Status(e3.now).SpendMicroUSD != 1066 {
			t.Errorf("usage %v: ledger %d µ$, memory %d µ$; want the worst case 1066", usage, day.SpendMicroUSD, e3.brake.Status(e3.now).SpendMicroUSD)
		}
		if !strings.Contains(e3.logs.String(), "without token usage") {
			t.Errorf("usage %v: no warning logged", usage)
		}
	}
}

func TestMidnightRollover(t *testing.T) {
	clk := newClock(time.Date(2026, 11, 30, 23, 59, 58, 0, time.UTC))
	e := newEnv(t, envOptions{clock: clk.now, attempts: 2, budget: budget.Config{DailyRequests: 2}})
	for range 2 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		decodeOK(t, resp, data)
	}
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "daily_limit")
	other := e.newKey("zoe", "")
	resp, data = e.post(other, "image/png", pngBytes(t, 16, 16))
	p := edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
	if ra := resp.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q, want 2 (seconds to midnight)", ra)
	}
	_ = p

	clk.set(time.Date(2026, 12, 1, 0, 0, 1, 0, time.UTC))
	resp, data = e.post(e.key, "image/png", pngBytes(t, 16, 16))
	decodeOK(t, resp, data)

	yesterday, _ := e.db.Budget("2026-11-30")
	today, _ := e.db.Budget("2026-12-01")
	if yesterday.Requests != 2 || today.Requests != 1 {
		t.Errorf("yesterday %+v, today %+v; want 2 and 1 requests", yesterday, today)
	}
}

// failingLedger refuses every durable lease.
type failingLedger struct{ calls atomic.Int64 }

func (f *failingLedger) Lease(context.Context, string, int64, int64, ...budget.LedgerDay) error {
	f.calls.Add(1)
	return errors.New("disk on fire")
}

func (f *failingLedger) Settle(context.Context, budget.Settlement) error { return nil }

// panickingLimiter is a layer 1 whose machinery is broken.
type panickingLimiter struct{}

func (panickingLimiter) Allow(string, time.Time) error { panic("limiter bug") }

// A defense layer whose machinery is broken lets requests through and is
// counted and logged (once a minute).
func TestLayersFailOpen(t *testing.T) {
	e := newEnv(t, envOptions{budget: budget.Config{DailyRequests: 2}, rate: panickingLimiter{}})
	for range 3 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		if resp.StatusCode == http.StatusServiceUnavailable {
			edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
			continue
		}
		decodeOK(t, resp, data)
	}
	// The budget still held its ceiling of 2.
	if got := e.gemini.calls.Load(); got != 2 {
		t.Errorf("%d upstream calls, want 2", got)
	}
	metrics := scrape(t, e)
	for _, want := range []string{
		`breakwater_layer_failopen_total{layer="rate"} 3`,
		`breakwater_refusals_total{layer="budget",reason="daily_requests"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if n := strings.Count(e.logs.String(), "defense layer failed open"); n != 1 {
		t.Errorf("%d fail-open log lines, want 1 (one a minute per layer):\n%s", n, e.logs.String())
	}
}

// A budget reservation that cannot be written refuses the call instead of
// failing open: the usage record shares the disk, so the read would be
// paid for and withheld. Paid calls pause as after a failed usage record.
func TestFailedReservationRefusesTheCall(t *testing.T) {
	ledger := &failingLedger{}
	e := newEnv(t, envOptions{ledger: ledger, budget: budget.Config{DailyRequests: 100}})
	for range 3 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "usage_unavailable")
		if resp.Header.Get("Retry-After") == "" {
			t.Error("no Retry-After")
		}
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("%d upstream calls with the ledger failing, want 0", got)
	}
	if got := ledger.calls.Load(); got != 1 {
		t.Errorf("%d reservation writes, want 1: the others wait out the pause", got)
	}
	metrics := scrape(t, e)
	for _, want := range []string{
		`breakwater_refusals_total{layer="usage",reason="ledger_failing"} 1`,
		`breakwater_refusals_total{layer="usage",reason="records_failing"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, `breakwater_layer_failopen_total{layer="budget"} 1`) {
		t.Error("the failed reservation was counted as failing open")
	}
}

func scrape(t *testing.T, e *env) string {
	t.Helper()
	resp, data := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/metrics", testAdminToken))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %d", resp.StatusCode)
	}
	return string(data)
}

func TestRestartKeepsDailyLineAndWindows(t *testing.T) {
	dir := t.TempDir()
	gemini := newFakeGemini(t)
	opts := envOptions{dir: dir, gemini: gemini, attempts: 3, limits: limiter.Config{Rate: 4, Window: time.Hour}}
	e := newEnv(t, opts)
	for range 3 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		decodeOK(t, resp, data)
	}
	e.writeBehind(e.db).Flush()
	key := e.key
	e.http.Close()
	e.events.Close(context.Background())
	e.db.Close()

	e2 := newEnv(t, opts)
	resp, data := e2.post(key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "daily_limit")
	if got := e2.windows.(*limiter.Limiter).Len(); got != 1 {
		t.Errorf("%d rate windows after restart, want 1", got)
	}
	// The fourth request used the last rate slot of the hour; a fifth
	// is refused by layer 1, as before the restart.
	resp, data = e2.post(key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
}

// TestRefusalsWriteNothing sends refused requests and checks the database
// file is byte for byte the same afterwards; the write-behind then writes
// today's refusal counts, one state in one write, and nothing else.
func TestRefusalsWriteNothing(t *testing.T) {
	e := newEnv(t, envOptions{limits: limiter.Config{Rate: 1, Window: time.Hour}})
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	store := &savedStates{StateStore: e.db}
	wb := e.writeBehind(store)
	wb.Flush()
	e.events.Close(context.Background()) // stop the statistics writer, flushing it
	before := fileHash(t, e.db.Path())

	for range 50 {
		resp, data := e.post(e.key, "image/png", img)
		edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")
		resp, data = e.post("bw_"+strings.Repeat("x", 32), "image/png", img)
		edgetest.DecodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")
	}
	if after := fileHash(t, e.db.Path()); after != before {
		t.Error("refused requests changed the database file")
	}
	store.names = nil
	wb.Flush()
	if got, want := strings.Join(store.names, " "), state.RefusalsState(e.srv.calendar.Day(time.Now())); got != want {
		t.Errorf("the write-behind wrote %q after the refusals, want only %q", got, want)
	}
	if got := e.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
}

func fileHash(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestChangedThresholdsTakeEffect(t *testing.T) {
	e := newEnv(t, envOptions{limits: limiter.Config{Rate: 1, Window: time.Hour}, budget: budget.Config{DailyRequests: 100}})
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "rate_limited")

	e.windows.SetConfig(limiter.Config{Rate: 10, Window: time.Hour})
	resp, data = e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)

	e.brake.SetConfig(budget.Config{DailyRequests: 2})
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
}

// panickingReader is an upstream client with a bug.
type panickingReader struct{}

func (panickingReader) ReadModel(context.Context, string, ocr.Image, func() bool) (ocr.Result, error) {
	panic("reader bug")
}

func TestPanicAfterReserveReleasesSlot(t *testing.T) {
	e := newEnv(t, envOptions{quota: 1})
	e.srv.d.Reader = panickingReader{}
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusInternalServerError, "internal")
	if got := e.quotas.Used("alice", time.Now()); got != 0 {
		t.Errorf("used %d after a panic, want 0", got)
	}
	// The one slot is free again.
	if err := e.quotas.Check("alice", 1, time.Now()); err != nil {
		t.Errorf("slot still held after a panic: %v", err)
	}
}

// countingReader counts the body bytes the server reads.
type countingReader struct {
	n    atomic.Int64
	left int
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.left == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.left)
	c.left -= n
	c.n.Add(int64(n))
	return n, nil
}

func TestExhaustedUserRefusedBeforeBodyIsRead(t *testing.T) {
	for _, c := range []struct {
		name string
		opts envOptions
		code string
	}{
		{"quota", envOptions{quota: 1}, "quota_exceeded"},
		{"daily line", envOptions{attempts: 1}, "daily_limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.opts)
			resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
			decodeOK(t, resp, data)
			body := &countingReader{left: 8 << 20}
			req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/v1/ocr", io.NopCloser(body))
			req.ContentLength = 8 << 20
			req.Header.Set("Authorization", "Bearer "+e.key)
			req.Header.Set("Content-Type", "image/png")
			resp, data = do(t, req)
			edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, c.code)
			// The client may have sent some bytes before the answer; the
			// server did not wait for the 8 MiB.
			if got := body.n.Load(); got >= 8<<20 {
				t.Errorf("the whole body was sent (%d bytes)", got)
			}
		})
	}
}

// failingState is a state store whose disk refuses every write.
type failingState struct{ calls atomic.Int64 }

func (f *failingState) SaveState(string, map[string][]byte) error {
	f.calls.Add(1)
	return errors.New("read-only file system")
}

func (f *failingState) DropStates(string, string) error { return nil }

func TestWriteBehindFailureFailsOpen(t *testing.T) {
	e := newEnv(t, envOptions{attempts: 10, limits: limiter.Config{Rate: 10, Window: time.Minute}})
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	fs := &failingState{}
	wb := e.writeBehind(fs)
	wb.Flush()
	// Requests go on; the lost writes are counted per layer.
	resp, data = e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	metrics := scrape(t, e)
	for _, want := range []string{
		`breakwater_layer_failopen_total{layer="rate"} 1`,
		`breakwater_layer_failopen_total{layer="attempts"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if fs.calls.Load() != 2 {
		t.Errorf("%d state writes, want 2", fs.calls.Load())
	}
}

func TestMetricsExposeTheService(t *testing.T) {
	e := newEnv(t, envOptions{budget: budget.Config{DailyRequests: 100, DailyUSD: 5}})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	decodeOK(t, resp, data)
	resp, _ = e.post("", "image/png", pngBytes(t, 16, 16))
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatal(resp.StatusCode)
	}
	do(t, mustRequest(t, http.MethodGet, e.http.URL+"/no/such/path", ""))
	m := scrape(t, e)
	for _, want := range []string{
		`breakwater_http_requests_total{route="/v1/ocr",status="200"} 1`,
		`breakwater_http_requests_total{route="/v1/ocr",status="401"} 1`,
		`breakwater_http_requests_total{route="unmatched",status="404"} 1`,
		`breakwater_upstream_calls_total{model="gemini-3.5-flash-lite",outcome="ok"} 1`,
		`breakwater_upstream_tokens_total{kind="prompt"} 298`,
		`breakwater_upstream_tokens_total{kind="output"} 24`,
		`breakwater_upstream_cost_usd_total 0.00015`,
		`breakwater_budget_requests_today 1`,
		`breakwater_budget_daily_usd 5`,
		`breakwater_budget_spent_today_usd 0.00015`,
		`breakwater_budget_brake_engaged 0`,
		`breakwater_usage_commit_seconds_count 1`,
		`breakwater_reservation_commit_seconds_count 1`,
		`breakwater_guard_overhead_seconds_count 1`,
		`breakwater_stats_events_dropped_total 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestMetricsCountCommits reads the storage writer's counters: three paid
// reads one after another are at least three usage records, each in a
// commit of its own. (The two counters are read at two moments, so a
// commit of the statistics recorder's may be counted in one and not yet
// in the other: their ratio is for intervals with many commits.)
func TestMetricsCountCommits(t *testing.T) {
	e := newEnv(t, envOptions{})
	value := func(name string) float64 {
		t.Helper()
		f, err := strconv.ParseFloat(metric(t, e, name), 64)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return f
	}
	commits0, writes0 := value("breakwater_storage_commits_total"), value("breakwater_storage_writes_total")
	for range 3 {
		resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
		decodeOK(t, resp, data)
	}
	commits := value("breakwater_storage_commits_total") - commits0
	writes := value("breakwater_storage_writes_total") - writes0
	if commits < 3 || writes < 3 {
		t.Errorf("after 3 paid reads: %v commits carrying %v writes, want at least 3 of each", commits, writes)
	}
}

// TestClockBehindLedgerKeepsTheDay restarts with the clock 15 minutes
// behind a day the ledger already holds (a VM restored before its clock
// synced): the layers start on the ledger's day, so when the clock comes
// back that day's spend and attempts still count, and daily_usd holds.
func TestClockBehindLedgerKeepsTheDay(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := db.Lease(ctx, "2026-03-10", 1, 9_000_000); err != nil { // $9 spent on the 10th
		t.Fatal(err)
	}
	at := func(d, h, m int) time.Time { return time.Date(2026, 3, d, h, m, 0, 0, time.UTC) }
	// mallory's 50 attempts on the 10th, as the write-behind stores them.
	if err := db.SaveState(state.AttemptsState("2026-03-10"), map[string][]byte{"mallory": binary.BigEndian.AppendUint64(nil, 50)}); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	layers, err := state.LoadLayers(db, limiter.Config{Rate: 100, Window: time.Minute}, budget.Config{DailyUSD: 10}, time.UTC,
		at(9, 23, 45), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "clock is behind the budget ledger") {
		t.Errorf("no warning about the clock:\n%s", logs.String())
	}
	if st := layers.Brake.Status(at(9, 23, 50)); st.Day != "2026-03-10" || st.SpendMicroUSD != 9_000_000 {
		t.Errorf("brake on %s with %d µ$, want 2026-03-10 with $9", st.Day, st.SpendMicroUSD)
	}
	if n := layers.Attempts.Count("mallory", at(9, 23, 50)); n != 50 {
		t.Errorf("mallory's attempts %d before the clock catches up, want 50", n)
	}
	// The clock comes back: the 10th goes on from $9 and 50 attempts.
	if n := layers.Attempts.Count("mallory", at(10, 0, 10)); n != 50 {
		t.Errorf("mallory's attempts %d on the 10th, want 50", n)
	}
	accepted := 0
	for range 10 {
		if _, err := layers.Brake.Claim(1_000_000, at(10, 0, 10)); err == nil {
			accepted++
		}
	}
	if accepted != 1 {
		t.Errorf("%d claims of $1 accepted with $9 of $10 spent, want 1", accepted)
	}
}

// TestFarFutureLedgerDayIsNotBelieved: one reservation dated years ahead
// (a clock that once jumped) must not pin the service to that day, where
// every real day would share one budget; the clock's day is used and the
// log says why.
func TestFarFutureLedgerDayIsNotBelieved(t *testing.T) {
	db, err := storage.Open(filepath.Join(t.TempDir(), "bw.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Lease(context.Background(), "2036-02-07", 1, 5); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	layers, err := state.LoadLayers(db, limiter.Config{Rate: 100, Window: time.Minute}, budget.Config{DailyRequests: 3}, time.UTC,
		now, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if st := layers.Brake.Status(now); st.Day != "2026-05-01" || st.Month != "2026-05" {
		t.Errorf("brake on %s / %s, want the clock's 2026-05-01 / 2026-05", st.Day, st.Month)
	}
	if !strings.Contains(logs.String(), "far after the clock") {
		t.Errorf("no error about the ledger's far day:\n%s", logs.String())
	}
	// Each real day has its own 3 calls.
	for _, d := range []int{1, 2} {
		at := time.Date(2026, 5, d, 12, 0, 0, 0, time.UTC)
		n := 0
		for range 5 {
			if _, err := layers.Brake.Claim(1, at); err == nil {
				n++
			}
		}
		if n != 3 {
			t.Errorf("May %d: %d calls claimed, want 3", d, n)
		}
	}
}

// countingLedger counts the leases written through it.
type countingLedger struct {
	budget.Ledger
	reserves atomic.Int64
}

func (c *countingLedger) Lease(ctx context.Context, day string, calls, microUSD int64, giveBack ...budget.LedgerDay) error {
	c.reserves.Add(1)
	return c.Ledger.Lease(ctx, day, calls, microUSD, giveBack...)
}

// With every ceiling off there is nothing to hold across a crash: no
// reservation is written before the call (one fsync fewer per read), and
// the usage record's transaction adds each call to the ledger.
func TestNoReservationWrittenWithTheCeilingsOff(t *testing.T) {
	for _, tt := range []struct {
		name   string
		budget budget.Config
		writes int64
	}{
		{"off", budget.Config{}, 0},
		{"on", budget.Config{DailyRequests: 100}, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ledger := &countingLedger{}
			e := newEnv(t, envOptions{ledger: ledger, budget: tt.budget})
			ledger.Ledger = e.db // what newEnv opened; used from the first request on
			for range 3 {
				resp, data := e.post(e.key, "image/png", pngBytes(t, 16+int(e.gemini.calls.Load()), 16))
				decodeOK(t, resp, data)
			}
			if got := ledger.reserves.Load(); got != tt.writes {
				t.Errorf("%d reservations written, want %d", got, tt.writes)
			}
			day, err := e.db.Budget(budget.DayKey(time.Now(), e.loc))
			if err != nil || day.Requests != 3 {
				t.Errorf("ledger %+v %v, want the 3 calls", day, err)
			}
		})
	}
}

// savedStates is a state store that records the names it writes.
type savedStates struct {
	state.StateStore
	names []string
}

func (s *savedStates) SaveState(name string, entries map[string][]byte) error {
	s.names = append(s.names, name)
	return s.StateStore.SaveState(name, entries)
}

// refusedAnyway is a fault that says its request was refused all the
// same, as a failed admission's on PostgreSQL does.
type refusedAnyway struct{ error }

func (refusedAnyway) RefusedClosed() bool { return true }

// The fail-open log line says what became of the request: let through;
// decided by this instance alone (a shared limit's memory); or refused
// with 503, when the fault came with the quota slot's, which fails closed.
func TestFaultLineSaysWhatHappened(t *testing.T) {
	cause := errors.New("connection refused")
	for _, tc := range []struct {
		err        error
		want, lack string
	}{
		{cause, "request let through", "refused"},
		{fmt.Errorf("%w: %w", ErrDecidedAlone, cause), "decided by this instance alone", "let through"},
		{fmt.Errorf("postgres: admit a request: %w", refusedAnyway{cause}), "the request was refused (503", "let through"},
	} {
		line := faultLine(tc.err)
		if !strings.Contains(line, tc.want) || strings.Contains(line, tc.lack) {
			t.Errorf("%v: %q, want %q and not %q", tc.err, line, tc.want, tc.lack)
		}
	}
}
