package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/server/app"
)

// countingGemini answers generateContent in the real wire format after
// hold, with 503 UNAVAILABLE while busy is set, and counts the calls.
type countingGemini struct {
	*httptest.Server
	calls atomic.Int64
	busy  atomic.Bool
}

func newCountingGemini(t *testing.T, hold time.Duration) *countingGemini {
	t.Helper()
	g := &countingGemini{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		io.Copy(io.Discard, r.Body)
		time.Sleep(hold)
		w.Header().Set("Content-Type", "application/json")
		if g.busy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE"}}`)
			return
		}
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":0,"totalTokenCount":322},"modelVersion":"gemini-2.5-flash"}`)
	}))
	t.Cleanup(g.Close)
	return g
}

// clock is a settable clock for the App.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// answerFixture is a service with a fake Gemini that counts calls, on a
// clock the test moves, and keys for two users.
type answerFixture struct {
	addr       string
	gemini     *countingGemini
	clk        *clock
	ann, bob   string
	path       string
	stopServer func()
}

func newAnswerFixture(t *testing.T, hold time.Duration, extra string) *answerFixture {
	t.Helper()
	f := &answerFixture{gemini: newCountingGemini(t, hold), clk: &clock{t: time.Now()}}
	f.path = writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
max_in_flight_per_user = 32
[storage]
path = %q
[ocr]
base_url = %q
%s
[limits.user]
burst = 100
[plans.free]
monthly_quota = 100
`, filepath.Join(t.TempDir(), "bw.db"), f.gemini.URL, extra))
	f.ann, f.bob = createKey(t, f.path, "ann"), createKey(t, f.path, "bob")
	env := envFrom(map[string]string{"GEMINI_API_KEY": "test-key"})
	c, err := app.Load(f.path, env)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Open(context.Background(), c, app.Options{Getenv: env, Logger: slog.New(slog.DiscardHandler), Now: f.clk.now})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	f.stopServer = func() { once.Do(a.Close) }
	t.Cleanup(f.stopServer)
	f.addr = a.Addr()
	return f
}

type ocrAnswer struct {
	status   int
	body     []byte
	replayed string
	code     string
	used     int64
	cached   bool
}

func (f *answerFixture) post(t *testing.T, key, idem string, img []byte) ocrAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+f.addr+"/v1/ocr", bytes.NewReader(img))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return ocrAnswer{}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	a := ocrAnswer{status: resp.StatusCode, body: body, replayed: resp.Header.Get("Idempotent-Replayed")}
	var v struct {
		Code   string
		Quota  struct{ Used int64 }
		Cached bool
	}
	json.Unmarshal(body, &v)
	a.code, a.used, a.cached = v.Code, v.Quota.Used, v.Cached
	return a
}

// labelPNG is a small PNG that differs by seed.
func labelPNG(t *testing.T, seed uint8) []byte {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, 40, 20))
	for i := range img.Pix {
		img.Pix[i] = seed + uint8(i)
	}
	img.Set(0, 0, color.Gray{Y: seed})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A repeat with the same key and image is the stored answer, byte for
// byte, with no second call and no second quota read; the key with
// another image is refused.
func TestIdempotencyKeyReplays(t *testing.T) {
	f := newAnswerFixture(t, 0, `dedupe_window = "0s"`)
	img := labelPNG(t, 1)
	first := f.post(t, f.ann, "order-7", img)
	again := f.post(t, f.ann, "order-7", img)
	if first.status != http.StatusOK || again.status != http.StatusOK {
		t.Fatalf("statuses %d, %d: %s / %s", first.status, again.status, first.body, again.body)
	}
	if !bytes.Equal(first.body, again.body) || again.replayed != "true" || first.replayed != "" {
		t.Errorf("replay %q (Idempotent-Replayed %q), want the first body %q byte for byte, marked", again.body, again.replayed, first.body)
	}
	if got := f.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
	// The quota was used once: the next read is the second.
	if next := f.post(t, f.ann, "order-8", img); next.status != http.StatusOK || next.used != 2 {
		t.Errorf("the next read: %d used %d, want 200 and 2 reads used", next.status, next.used)
	}
	if other := f.post(t, f.ann, "order-7", labelPNG(t, 2)); other.status != http.StatusUnprocessableEntity || other.code != "idempotency_key_reused" {
		t.Errorf("the key with another image: %d %s, want 422 idempotency_key_reused", other.status, other.code)
	}
	// Keys are per user: bob's order-7 is his own first request.
	if bobs := f.post(t, f.bob, "order-7", img); bobs.status != http.StatusOK || bobs.replayed != "" {
		t.Errorf("another user's same key: %d replayed %q, want a read of its own", bobs.status, bobs.replayed)
	}
	// The Structured Field string form names the same key.
	if sf := f.post(t, f.ann, `"order-8"`, img); sf.replayed != "true" {
		t.Errorf(`"order-8" as a quoted string: replayed %q, want the stored answer of order-8`, sf.replayed)
	}
	// Past the TTL the key is answered as new.
	f.clk.add(25 * time.Hour)
	calls := f.gemini.calls.Load()
	if late := f.post(t, f.ann, "order-7", img); late.status != http.StatusOK || late.replayed != "" || f.gemini.calls.Load() != calls+1 {
		t.Errorf("after the TTL: %d replayed %q, calls %d, want a new read", late.status, late.replayed, f.gemini.calls.Load()-calls)
	}
	for _, bad := range []string{strings.Repeat("k", 256), "tab\there", `"unclosed\"`} {
		if a := f.post(t, f.ann, bad, img); a.status != http.StatusBadRequest || a.code != "idempotency_key_invalid" {
			t.Errorf("key %q: %d %s, want 400 idempotency_key_invalid", bad, a.status, a.code)
		}
	}
}

// 20 requests at once with one key make one upstream call: one 200, the
// others 409 idempotency_key_in_use with Retry-After 1.
func TestIdempotencyKeyInFlight(t *testing.T) {
	f := newAnswerFixture(t, 300*time.Millisecond, `dedupe_window = "0s"`)
	img := labelPNG(t, 3)
	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			a := f.post(t, f.ann, "pay-42", img)
			mu.Lock()
			codes[fmt.Sprint(a.status, " ", a.code)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes["200 "] != 1 || codes["409 idempotency_key_in_use"] != 19 {
		t.Errorf("answers %v, want one 200 and 19 409 idempotency_key_in_use", codes)
	}
	if got := f.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
}

// A first request that failed keeps nothing: its key is tried again.
func TestIdempotencyKeyAfterAFailure(t *testing.T) {
	f := newAnswerFixture(t, 0, `dedupe_window = "0s"
timeout = "2s"`)
	img := labelPNG(t, 4)
	f.gemini.busy.Store(true)
	if a := f.post(t, f.ann, "retry-me", img); a.status != http.StatusBadGateway {
		t.Fatalf("with the upstream down: %d %s, want 502", a.status, a.body)
	}
	calls := f.gemini.calls.Load()
	f.gemini.busy.Store(false)
	if a := f.post(t, f.ann, "retry-me", img); a.status != http.StatusOK || a.replayed != "" {
		t.Errorf("the retry: %d replayed %q, want a new read", a.status, a.replayed)
	}
	if got := f.gemini.calls.Load() - calls; got != 1 {
		t.Errorf("the retry made %d calls, want 1", got)
	}
}

// The same image again within the dedupe window is its earlier read,
// "cached", with no call and no quota; another user's same image is a
// read of their own; after the window it is read again.
func TestSameImageIsNotBoughtTwice(t *testing.T) {
	f := newAnswerFixture(t, 0, "")
	img := labelPNG(t, 5)
	first := f.post(t, f.ann, "", img)
	again := f.post(t, f.ann, "", img)
	if first.status != http.StatusOK || first.cached || again.status != http.StatusOK || !again.cached {
		t.Fatalf("first %d cached=%v, again %d cached=%v: %s", first.status, first.cached, again.status, again.cached, again.body)
	}
	if again.used != 1 {
		t.Errorf("the cached answer shows %d reads used, want 1 (it is not a read)", again.used)
	}
	if got := f.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
	if bobs := f.post(t, f.bob, "", img); bobs.status != http.StatusOK || bobs.cached || f.gemini.calls.Load() != 2 {
		t.Errorf("another user's same image: cached=%v, calls %d; want a real read", bobs.cached, f.gemini.calls.Load())
	}
	f.clk.add(11 * time.Minute)
	if late := f.post(t, f.ann, "", img); late.status != http.StatusOK || late.cached || f.gemini.calls.Load() != 3 {
		t.Errorf("after the window: cached=%v, calls %d; want a real read", late.cached, f.gemini.calls.Load())
	}
}
