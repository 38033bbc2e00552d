package app

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// gatedGemini answers generateContent in the real REST format and counts
// the calls; while gate is open (not yet closed) a call waits for it, and
// the next failNext calls answer 500 INTERNAL (not retried).
type gatedGemini struct {
	*httptest.Server
	calls    atomic.Int64
	failNext atomic.Int64
	mu       sync.Mutex
	gate     chan struct{} // closed: calls go through
}

// hold makes the calls from now on wait until the returned func is called.
func (g *gatedGemini) hold() (open func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.gate = ch
	g.mu.Unlock()
	return func() { close(ch) }
}

func newGatedGemini(t *testing.T) *gatedGemini {
	t.Helper()
	g := &gatedGemini{gate: make(chan struct{})}
	close(g.gate)
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		io.Copy(io.Discard, r.Body)
		g.mu.Lock()
		gate := g.gate
		g.mu.Unlock()
		<-gate
		w.Header().Set("Content-Type", "application/json")
		if g.failNext.Add(-1) >= 0 {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"code":500,"message":"internal error","status":"INTERNAL"}}`)
			return
		}
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":0,"totalTokenCount":322},"modelVersion":"gemini-2.5-flash"}`)
	}))
	t.Cleanup(g.Close)
	return g
}

// twoInstances opens two Apps on one fresh PostgreSQL database with gemini
// as their upstream, and returns them with an API key of ann made before
// the second started.
func twoInstances(t *testing.T, gemini *gatedGemini, now func() time.Time) (a, b *App, key string) {
	t.Helper()
	a, b, key, _ = twoInstancesAt(t, gemini, now)
	return a, b, key
}

// twoInstancesAt is twoInstances that also returns the database's URL.
func twoInstancesAt(t *testing.T, gemini *gatedGemini, now func() time.Time) (a, b *App, key, url string) {
	t.Helper()
	url = pgtest.NewDatabase(t)
	secrets := env(map[string]string{
		"GEMINI_API_KEY": "test-key", postgres.EnvURL: url,
		"BREAKWATER_SECRET": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
	})
	cfg, err := Load(writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[storage]
backend = "postgres"
[ocr]
base_url = %q
dedupe_window = "0s"
[limits.user]
rate = 100000
burst = 100
[plans.free]
monthly_quota = 100
`, gemini.URL)), secrets)
	if err != nil {
		t.Fatal(err)
	}
	open := func() *App {
		a, err := Open(context.Background(), cfg, Options{Getenv: secrets, Logger: slog.New(slog.DiscardHandler), Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Close)
		return a
	}
	a = open()
	if key, _, err = a.Keys().Create("ann", "free"); err != nil {
		t.Fatal(err)
	}
	return a, open(), key, url
}

type answer struct {
	status   int
	body     []byte
	replayed string
}

// postOCR sends img to a's /v1/ocr with key and Idempotency-Key idem.
func postOCR(t *testing.T, a *App, key, idem string, img []byte) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+a.Addr()+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	req.Header.Set("Idempotency-Key", idem)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return answer{status: resp.StatusCode, body: body, replayed: resp.Header.Get("Idempotent-Replayed")}
}

// grayPNG is a small PNG that differs by seed.
func grayPNG(t *testing.T, seed uint8) []byte {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, 40, 20))
	for i := range img.Pix {
		img.Pix[i] = seed + uint8(i)
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// usageRows counts the usage rows in the shared database.
func usageRows(t *testing.T, a *App) int {
	t.Helper()
	rows, err := a.db.(*postgres.DB).Usage(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return len(rows)
}

// Idempotency holds across two instances on one PostgreSQL database: the
// same key sent to both at once makes one upstream call (the instance that
// loses the key's claim answers 409 idempotency_key_in_use while the other
// reads, and the kept answer to the client's retry), one usage row, and
// the same answer byte for byte to both; a retry that lands on the other
// instance is the kept answer, charged once; a read that fails on one
// instance gives the key back, so a retry on the other reads at once.
func TestIdempotencyAcrossInstances(t *testing.T) {
	gemini := newGatedGemini(t)
	a, b, key := twoInstances(t, gemini, time.Now)

	open := gemini.hold() // the first read waits until both have asked
	img := grayPNG(t, 1)
	conflicts := make(chan struct{}, 100)
	answers := make([]answer, 2)
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for i, inst := range []*App{a, b} {
		wg.Go(func() { // a client that retries on 409, as docs/API.md shows
			for time.Now().Before(deadline) {
				answers[i] = postOCR(t, inst, key, "pay-1", img)
				if answers[i].status != http.StatusConflict {
					return
				}
				conflicts <- struct{}{}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	select {
	case <-conflicts: // one instance reads, the other said the key is in flight
	case <-time.After(20 * time.Second):
		t.Error("no 409 while one instance held the key")
	}
	open()
	wg.Wait()
	if answers[0].status != http.StatusOK || answers[1].status != http.StatusOK {
		t.Fatalf("answers %d %q and %d %q, want two 200s", answers[0].status, answers[0].body, answers[1].status, answers[1].body)
	}
	if !bytes.Equal(answers[0].body, answers[1].body) || answers[0].replayed+answers[1].replayed != "true" {
		t.Errorf("answers %q (replayed %q) and %q (replayed %q), want one read and its replay, byte for byte",
			answers[0].body, answers[0].replayed, answers[1].body, answers[1].replayed)
	}
	if n, rows := gemini.calls.Load(), usageRows(t, a); n != 1 || rows != 1 {
		t.Errorf("%d upstream calls and %d usage rows for one key on two instances, want 1 and 1", n, rows)
	}

	// A retry that lands on the other instance: the kept answer, charged once.
	first := postOCR(t, a, key, "pay-2", grayPNG(t, 2))
	retry := postOCR(t, b, key, "pay-2", grayPNG(t, 2))
	if first.status != http.StatusOK || !bytes.Equal(first.body, retry.body) || retry.replayed != "true" {
		t.Errorf("retry on the other instance: %d %q (replayed %q), want %q replayed", retry.status, retry.body, retry.replayed, first.body)
	}
	if n, rows := gemini.calls.Load(), usageRows(t, b); n != 2 || rows != 2 {
		t.Errorf("%d upstream calls and %d usage rows after a read and its retry elsewhere, want 2 and 2", n, rows)
	}
	if next := postOCR(t, b, key, "pay-3", grayPNG(t, 3)); !bytes.Contains(next.body, []byte(`"used":3`)) {
		t.Errorf("the next read %d %q, want the third of the quota (the retry not charged)", next.status, next.body)
	}

	// A read that fails on one instance keeps nothing and gives the key
	// back: its retry on the other reads at once, not 409.
	gemini.failNext.Store(1)
	if failed := postOCR(t, a, key, "pay-4", grayPNG(t, 4)); failed.status != http.StatusBadGateway {
		t.Errorf("failed read: %d %q, want 502", failed.status, failed.body)
	}
	if again := postOCR(t, b, key, "pay-4", grayPNG(t, 4)); again.status != http.StatusOK || again.replayed != "" {
		t.Errorf("retry of a failed read on the other instance: %d %q (replayed %q), want a read of its own",
			again.status, again.body, again.replayed)
	}
}

// pgClock is a settable clock for the Apps.
type pgClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *pgClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *pgClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// A claim left by an instance that crashed while reading (its row in
// answer_claims, never given back) holds the key no longer than its ttl:
// until then the key is in flight (409), after it the key is read.
func TestIdempotencyClaimOfACrashedInstanceLapses(t *testing.T) {
	gemini := newGatedGemini(t)
	clk := &pgClock{t: time.Now()}
	a, b, key, url := twoInstancesAt(t, gemini, clk.now)
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `INSERT INTO answer_claims (user_id, key, owner, expires_at) VALUES ($1, $2, $3, $4)`,
		"ann", "pay-9", "a-crashed-instance", clk.now().Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	img := grayPNG(t, 9)
	for _, inst := range []*App{a, b} {
		if got := postOCR(t, inst, key, "pay-9", img); got.status != http.StatusConflict {
			t.Errorf("key claimed by a crashed instance: %d %q, want 409 until the claim lapses", got.status, got.body)
		}
	}
	clk.add(3*time.Minute + time.Second)
	if got := postOCR(t, b, key, "pay-9", img); got.status != http.StatusOK || got.replayed != "" {
		t.Errorf("after the claim lapsed: %d %q (replayed %q), want a read", got.status, got.body, got.replayed)
	}
	if retry := postOCR(t, a, key, "pay-9", img); retry.replayed != "true" || gemini.calls.Load() != 1 {
		t.Errorf("its retry on the other instance: %d (replayed %q), %d calls; want the kept answer, 1 call",
			retry.status, retry.replayed, gemini.calls.Load())
	}
}
