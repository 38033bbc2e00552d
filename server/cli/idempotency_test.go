package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

	"breakwater/detect"
	"breakwater/server/app"
	"breakwater/storage"
)

// countingGemini answers generateContent in the real wire format after
// hold (and, when gate is set, once it is closed), with 503 UNAVAILABLE
// while busy is set and 500 INTERNAL (not retried) to the next failNext
// calls, and counts the calls.
type countingGemini struct {
	*httptest.Server
	calls    atomic.Int64
	busy     atomic.Bool
	failNext atomic.Int64
	gate     chan struct{} // set before the first call
}

func newCountingGemini(t *testing.T, hold time.Duration) *countingGemini {
	t.Helper()
	g := &countingGemini{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		io.Copy(io.Discard, r.Body)
		time.Sleep(hold)
		if g.gate != nil {
			<-g.gate
		}
		w.Header().Set("Content-Type", "application/json")
		if g.busy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE"}}`)
			return
		}
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
	path, db   string
	stopServer func()
}

func newAnswerFixture(t *testing.T, hold time.Duration, extra string) *answerFixture {
	t.Helper()
	return newAnswerFixtureInFlight(t, hold, 32, extra)
}

// newAnswerFixtureInFlight is newAnswerFixture with max_in_flight_per_user
// inFlight; extra goes into [ocr].
func newAnswerFixtureInFlight(t *testing.T, hold time.Duration, inFlight int, extra string) *answerFixture {
	t.Helper()
	f := &answerFixture{gemini: newCountingGemini(t, hold), clk: &clock{t: time.Now()}, db: filepath.Join(t.TempDir(), "bw.db")}
	f.path = writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
max_in_flight_per_user = %d
[storage]
path = %q
[ocr]
base_url = %q
%s
[limits.user]
rate = 100000
burst = 100
[plans.free]
monthly_quota = 100
`, inFlight, f.db, f.gemini.URL, extra))
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

// Ten requests at once with one image from one user make one upstream
// call and one paid read: the other nine wait for its answer and are
// answered from the dedupe window.
func TestSameImageAtOnceIsReadOnce(t *testing.T) {
	const n = 10
	f := newAnswerFixtureInFlight(t, 0, n, "")
	release := f.holdUpstream(t)
	img := labelPNG(t, 6)
	answers := make([]ocrAnswer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = f.postAdmitted(t, f.ann, img) })
	}
	// The upstream holds its answer until every request is in the
	// server, and a moment more for them to reach the read.
	f.waitInFlight(t, f.ann, n)
	time.Sleep(200 * time.Millisecond)
	release()
	wg.Wait()
	cached := 0
	for i, a := range answers {
		if a.status != http.StatusOK {
			t.Errorf("request %d: %d %s", i, a.status, a.body)
		}
		if a.cached {
			cached++
		}
	}
	if got := f.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls for one image sent %d times at once, want 1", got, n)
	}
	if cached != n-1 {
		t.Errorf("%d answers cached, want %d", cached, n-1)
	}
	if rows := f.usageRows(t); rows != 1 {
		t.Errorf("%d usage rows, want 1 paid read", rows)
	}
}

// A first read that fails wakes the requests waiting for it, and the next
// of them reads the image itself.
func TestSameImageAtOnceAfterAFailure(t *testing.T) {
	f := newAnswerFixtureInFlight(t, 0, 2, "")
	release := f.holdUpstream(t)
	f.gemini.failNext.Store(1)
	img := labelPNG(t, 7)
	first := make(chan ocrAnswer)
	go func() { first <- f.post(t, f.ann, "", img) }()
	for deadline := time.Now().Add(10 * time.Second); f.gemini.calls.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first read never called the upstream")
		}
	}
	second := make(chan ocrAnswer)
	go func() { second <- f.postAdmitted(t, f.ann, img) }()
	f.waitInFlight(t, f.ann, 2)
	time.Sleep(100 * time.Millisecond) // the second reaches its wait
	if got := f.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls while the first read is under way, want 1", got)
	}
	release()
	if a := <-first; a.status != http.StatusBadGateway {
		t.Errorf("the first read: %d %s, want 502", a.status, a.body)
	}
	if a := <-second; a.status != http.StatusOK || a.cached {
		t.Errorf("the waiting request after the failure: %d cached=%v %s, want a read of its own", a.status, a.cached, a.body)
	}
	if got := f.gemini.calls.Load(); got != 2 {
		t.Errorf("%d upstream calls in all, want 2", got)
	}
}

// An Idempotency-Key first answered from the dedupe window is bound to
// its image: the key again is that answer, the key with another image
// 422.
func TestIdempotencyKeyOfACachedAnswer(t *testing.T) {
	f := newAnswerFixture(t, 0, "")
	img := labelPNG(t, 8)
	if a := f.post(t, f.ann, "", img); a.status != http.StatusOK || a.cached {
		t.Fatalf("the first read: %d cached=%v %s", a.status, a.cached, a.body)
	}
	cached := f.post(t, f.ann, "order-9", img)
	if cached.status != http.StatusOK || !cached.cached {
		t.Fatalf("the same image with a key: %d cached=%v %s, want the cached answer", cached.status, cached.cached, cached.body)
	}
	if again := f.post(t, f.ann, "order-9", img); again.replayed != "true" || !bytes.Equal(again.body, cached.body) {
		t.Errorf("the key again: replayed %q, %q; want %q replayed", again.replayed, again.body, cached.body)
	}
	calls := f.gemini.calls.Load()
	if other := f.post(t, f.ann, "order-9", labelPNG(t, 9)); other.status != http.StatusUnprocessableEntity || other.code != "idempotency_key_reused" {
		t.Errorf("the key with another image: %d %s, want 422 idempotency_key_reused", other.status, other.body)
	}
	if got := f.gemini.calls.Load(); got != calls {
		t.Errorf("%d upstream calls for the reused key, want none", got-calls)
	}
}

// postAdmitted is post without a key, sent again while it is refused 429
// too_many_in_flight: waitInFlight's probes hold a slot for a moment.
func (f *answerFixture) postAdmitted(t *testing.T, key string, img []byte) ocrAnswer {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if a := f.post(t, key, "", img); a.code != "too_many_in_flight" || time.Now().After(deadline) {
			return a
		}
	}
}

// holdUpstream makes the fake Gemini hold its answers until release is
// called, or the test ends.
func (f *answerFixture) holdUpstream(t *testing.T) (release func()) {
	f.gemini.gate = make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(f.gemini.gate) }) }
	t.Cleanup(release) // before the fixture's own: the server waits for its reads
	return release
}

// waitInFlight waits (at most 10 s) until user has n requests in the
// server: a probe that is not an image is then refused 429
// too_many_in_flight before its body is read (it is 415 while a slot is
// free). max_in_flight_per_user must be n. The probes keep under the
// fixture's burst of 100 a second.
func (f *answerFixture) waitInFlight(t *testing.T, key string, n int) {
	t.Helper()
	var last ocrAnswer
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if last = f.post(t, key, "", []byte("not an image")); last.code == "too_many_in_flight" {
			return
		}
	}
	t.Fatalf("%d requests never were in the server at once: the probe got %d %s", n, last.status, last.body)
}

// usageRows stops the server and counts the usage rows in its database.
func (f *answerFixture) usageRows(t *testing.T) int {
	t.Helper()
	f.stopServer()
	db, err := storage.Open(f.db, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	recs, err := db.Usage(time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return len(recs)
}

// One key sending one image 2,000 times over five minutes: one read, and
// the 1,999 cached answers stored as a few rows per minute, not one
// apiece; the daily aggregate still counts every one.
func TestSameImageRepeatedIsCountedPerMinute(t *testing.T) {
	f := newAnswerFixture(t, 0, "")
	img := labelPNG(t, 10)
	from := f.clk.now().Add(-time.Minute)
	const n = 2000
	for i := range n {
		if a := f.post(t, f.ann, "", img); a.status != http.StatusOK || a.cached != (i > 0) {
			t.Fatalf("request %d: %d cached=%v %s", i, a.status, a.cached, a.body)
		}
		f.clk.add(150 * time.Millisecond) // 2,000 in 300 s
	}
	f.stopServer()
	db, err := storage.Open(f.db, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	events, err := db.Events(from, f.clk.now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	agg := detect.NewAggregator(from.Format("2006-01-02"), detect.Lines{}, 0)
	var cached int64
	rows := 0
	for _, e := range events {
		agg.Add(e)
		if e.Outcome == detect.OutcomeCached {
			cached += e.N()
			rows++
		}
	}
	t.Logf("%d requests: %d event rows, %d of them for %d cached answers", n, len(events), rows, cached)
	if cached != n-1 {
		t.Errorf("the rows count %d cached answers, want %d", cached, n-1)
	}
	if rows > 7 { // five minutes, and the minutes it starts and ends in
		t.Errorf("%d rows of cached answers, want one a minute (at most 7)", rows)
	}
	day := agg.Done()
	if day.Service.Cached != n-1 || day.Service.Attempts != 1 {
		t.Errorf("the aggregate counts %d cached and %d attempts, want %d and 1", day.Service.Cached, day.Service.Attempts, n-1)
	}
	for user, u := range day.Users {
		if u.Cached != n-1 {
			t.Errorf("user %s: %d cached, want %d", user, u.Cached, n-1)
		}
	}
}

// A request waiting for another's read of its image stops waiting when
// its client goes away: its in-flight slot is free again while the read
// goes on.
func TestSameImageWaiterLeaves(t *testing.T) {
	f := newAnswerFixtureInFlight(t, 0, 2, "")
	release := f.holdUpstream(t)
	img := labelPNG(t, 11)
	lead := make(chan ocrAnswer, 1)
	go func() { lead <- f.post(t, f.ann, "", img) }()
	for deadline := time.Now().Add(10 * time.Second); f.gemini.calls.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first read never called the upstream")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan error, 1)
	go func() {
		for {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.addr+"/v1/ocr", bytes.NewReader(img))
			req.Header.Set("Authorization", "Bearer "+f.ann)
			req.Header.Set("Content-Type", "image/png")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				waiter <- err
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !bytes.Contains(body, []byte(`"too_many_in_flight"`)) { // a probe held the slot a moment
				waiter <- fmt.Errorf("answered %d %s", resp.StatusCode, body)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	f.waitInFlight(t, f.ann, 2)
	cancel()
	if err := <-waiter; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting request: %v, want its own cancellation", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if a := f.post(t, f.ann, "", []byte("not an image")); a.status == http.StatusUnsupportedMediaType {
			break // a slot is free
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter's slot was never given back")
		}
	}
	release()
	if a := <-lead; a.status != http.StatusOK || a.cached {
		t.Errorf("the read: %d cached=%v %s, want 200", a.status, a.cached, a.body)
	}
	if got := f.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
}
