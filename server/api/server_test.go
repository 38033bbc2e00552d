package api

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"image"
	"image/png"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/server/admin"
	"breakwater/server/edge"
	"breakwater/server/edgetest"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/jwtauth"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/storage"
)

// fakeGemini is a local stand-in for generateContent that speaks the real
// REST wire format and counts calls.
type fakeGemini struct {
	*httptest.Server
	calls atomic.Int64
	// byModel counts the calls to each model, by the name in the URL.
	byModel sync.Map // string -> *atomic.Int64
	// respond writes the answer; nil answers two good serials.
	respond atomic.Pointer[func(w http.ResponseWriter, r *http.Request)]
}

// set changes how the fake answers; nil restores the good answer.
func (f *fakeGemini) set(respond func(w http.ResponseWriter, r *http.Request)) {
	if respond == nil {
		f.respond.Store(nil)
		return
	}
	f.respond.Store(&respond)
}

const geminiKey = "test-gemini-key"

// testFallback is the fallback model the fake serves besides the default.
const testFallback = "gemini-2.5-flash-lite"

// callsTo is how many calls reached model.
func (f *fakeGemini) callsTo(model string) int64 {
	if n, ok := f.byModel.Load(model); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func newFakeGemini(t testing.TB) *fakeGemini {
	t.Helper()
	f := &fakeGemini{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		model, _ := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1beta/models/"), ":generateContent")
		n, _ := f.byModel.LoadOrStore(model, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if r.Method != http.MethodPost || (model != ocr.DefaultModel && model != testFallback) || r.Header.Get("x-goog-api-key") != geminiKey {
			http.Error(w, `{"error":{"code":404,"message":"not found","status":"NOT_FOUND"}}`, http.StatusNotFound)
			return
		}
		var req struct {
			Contents []struct {
				Parts []struct {
					InlineData *struct{ MimeType, Data string } `json:"inlineData"`
				} `json:"parts"`
			} `json:"contents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Contents) == 0 || req.Contents[0].Parts[0].InlineData == nil {
			http.Error(w, `{"error":{"code":400,"message":"bad request","status":"INVALID_ARGUMENT"}}`, http.StatusBadRequest)
			return
		}
		if respond := f.respond.Load(); respond != nil {
			(*respond)(w, r)
			return
		}
		writeModelText(w, `{"serials":["SN-12345","SN-67890"]}`)
	}))
	t.Cleanup(f.Close)
	return f
}

// writeModelText answers a generateContent call whose model output is text.
func writeModelText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "application/json")
	resp := map[string]any{
		"candidates": []any{map[string]any{
			"content":      map[string]any{"role": "model", "parts": []any{map[string]any{"text": text}}},
			"finishReason": "STOP", "index": 0,
		}},
		"usageMetadata": map[string]any{"promptTokenCount": 298, "candidatesTokenCount": 24, "thoughtsTokenCount": 0, "totalTokenCount": 322},
		"modelVersion":  "gemini-2.5-flash",
	}
	_ = json.NewEncoder(w).Encode(resp)
}

func writeUpstreamError(w http.ResponseWriter, code int, status string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"error":{"code":%d,"message":"upstream says no","status":%q}}`, code, status)
}

// env is one service under test: real storage, real HTTP on loopback, a
// fake Gemini.
type env struct {
	t            testing.TB
	dir          string
	db           *storage.DB
	gemini       *fakeGemini
	keys         *keys.Keyring
	verifier     *jwtauth.Verifier // nil unless envOptions.jwt is on
	quotas       guard.Quotas
	windows      state.RateWindows
	attempts     state.AttemptCounter
	brake        state.Brake
	metrics      *Metrics
	invites      *invites.Codes
	inviteKey    *invites.Key
	inviteLimits *invites.Limits
	plans        *keys.Plans
	edge         *edge.Edge
	srv          *Server
	adm          *admin.Server
	events       *detect.Recorder
	http         *httptest.Server
	admin        *httptest.Server
	key          string // an API key of user "alice"
	now          time.Time
	loc          *time.Location
	logs         *bytes.Buffer
}

type envOptions struct {
	quota      int64               // alice's monthly quota; default 100
	timeout    time.Duration       // ocr.timeout; default 5s
	usage      guard.UsageRecorder // default the database
	cfg        func(*edge.Config)  // server config changes
	gemini     *fakeGemini         // reuse one across restarts
	dir        string              // reuse a database across restarts
	adminToken string              // default "admin-secret"
	logTo      *bytes.Buffer       // captured logs
	plans      map[string]int64    // extra plans
	attempts   int64               // the free plan's daily line; 0: none
	limits     limiter.Config      // layer 1; zero: off
	budget     budget.Config       // layer 3; zero: off
	clock      func() time.Time    // the server's clock; default time.Now
	ledger     budget.Ledger       // default the database
	rate       guard.RateLimiter   // default e.windows
	invites    invites.Config      // [invites]; zero: the defaults
	alerts     Alerter             // default none
	counters   *detect.Counters    // layer 4's metrics; default fresh
	jwt        jwtauth.Config      // [auth.jwt]; JWKSURL empty: JWT sign-in off
	answers    bool                // keep answers (the database) for Idempotency-Key, 24h
	dedupe     time.Duration       // ocr.dedupe_window, with answers; 0: off
	claims     AnswerClaimer       // keys in flight across instances; nil: none
	fallback   string              // ocr.fallback_model; "" none
	planModel  map[string]string   // plans' model keys ("free" included)

	// service is the service's refusals (several instances); nil: none.
	service admin.ServiceRefusalReader
	// deny is the OCR route's deny cache; nil: none.
	deny *guard.Deny
	// redeemer wraps the invite lookups (the database); nil: none.
	redeemer func(invites.Redeemer) invites.Redeemer
}

const testAdminToken = "admin-secret-for-tests"

// withDefaults fills in the options left out with their defaults (a
// fresh directory and fake Gemini among them).
func (o envOptions) withDefaults(t testing.TB) envOptions {
	t.Helper()
	if o.quota == 0 {
		o.quota = 100
	}
	if o.timeout == 0 {
		o.timeout = 5 * time.Second
	}
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	if o.gemini == nil {
		o.gemini = newFakeGemini(t)
	}
	if o.adminToken == "" {
		o.adminToken = testAdminToken
	}
	if o.logTo == nil {
		o.logTo = &bytes.Buffer{}
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	return o
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	o = o.withDefaults(t)
	log := slog.New(slog.NewTextHandler(&syncWriter{w: o.logTo}, nil))
	e := &env{t: t, dir: o.dir, gemini: o.gemini, now: o.clock(), loc: time.UTC, logs: o.logTo}

	db, err := storage.Open(filepath.Join(o.dir, "bw.db"), storage.Options{Timeout: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e.db = db
	t.Cleanup(func() { db.Close() })

	plans := map[string]budget.Plan{"free": {MonthlyQuota: o.quota, DailyAttempts: o.attempts}}
	for name, q := range o.plans {
		plans[name] = budget.Plan{MonthlyQuota: q}
	}
	for name, m := range o.planModel {
		p := plans[name]
		p.Model = m
		plans[name] = p
	}
	e.plans = keys.NewPlans(plans)
	e.keys, err = keys.NewKeyring(db, e.plans.Has, keys.Options{Now: o.clock})
	if err != nil {
		t.Fatal(err)
	}
	var store state.LayerStore = db
	if o.ledger != nil {
		store = ledgerOverride{db, o.ledger}
	}
	layers, err := state.LoadLayers(store, o.limits, o.budget, e.loc, e.now, log)
	if err != nil {
		t.Fatal(err)
	}
	e.windows, e.attempts, e.quotas, e.brake = layers.Windows, layers.Attempts, layers.Quotas, layers.Brake
	ocfg := ocr.Config{BaseURL: o.gemini.URL, Timeout: o.timeout, FallbackModel: o.fallback}.WithDefaults()
	fallbackPrice, _ := ocfg.PriceOf(o.fallback)
	reader, err := ocr.NewGemini(ocfg, geminiKey, o.gemini.Client(), log)
	if err != nil {
		t.Fatal(err)
	}
	e.events = detect.NewRecorder(db, detect.RecorderOptions{Logger: log, FlushInterval: 10 * time.Millisecond, Now: o.clock})
	t.Cleanup(func() { e.events.Close(context.Background()) })
	var usage guard.UsageRecorder = db
	if o.usage != nil {
		usage = o.usage
	}
	cfg := edge.Config{}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	e.metrics = NewMetrics()
	e.openInvites(o)
	if o.jwt.Enabled() {
		e.verifier, err = jwtauth.NewVerifier(context.Background(), o.jwt, func(p string) bool { _, ok := plans[p]; return ok },
			jwtauth.Options{Logger: log, Now: o.clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.verifier.Close)
	}
	var codes invites.Redeemer = db
	if o.redeemer != nil {
		codes = o.redeemer(db)
	}
	var answers AnswerStore
	var ttl time.Duration
	if o.answers {
		answers, ttl = db, 24*time.Hour
	}
	ed, err := edge.New(cfg, edge.Options{Logger: log, Now: o.clock, Location: e.loc})
	if err != nil {
		t.Fatal(err)
	}
	op := operator.New(e.keys, e.invites, operator.Layers{Attempts: layers.Attempts, Quotas: layers.Quotas, Brake: layers.Brake}, db, e.plans.All, e.loc, operator.Options{Now: o.clock})
	srv, err := New(ed, Deps{
		Answers: answers, IdempotencyTTL: ttl, DedupeWindow: o.dedupe, Claims: o.claims,
		Keys: e.keys, JWT: e.verifier, Budget: e.brake, Plans: e.plans, Reader: reader, Events: e.events, Price: ocfg.Price,
		Model: ocfg.Model, FallbackModel: o.fallback, FallbackPrice: fallbackPrice,
		Layers:      guard.Layers{Rate: cmp.Or[guard.RateLimiter](o.rate, e.windows), Attempts: e.attempts, Quotas: e.quotas, Brake: e.brake, Usage: usage, Deny: o.deny},
		Operator:    op,
		InviteCodes: codes, InviteKey: e.inviteKey, InviteLimits: e.inviteLimits, Alerts: o.alerts, DetectCounters: o.counters,
		Metrics: e.metrics, Commits: db, Logger: log, Now: o.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.edge, e.srv = ed, srv
	e.http = httptest.NewServer(srv.Handler())
	t.Cleanup(e.http.Close)
	e.openAdmin(o, op, log)
	e.key = e.newKey("alice", "")
	return e
}

// openAdmin gives e the admin API beside its public API, on the same
// transport and operator, served on loopback.
func (e *env) openAdmin(o envOptions, op *operator.Operator, log *slog.Logger) {
	e.t.Helper()
	recent, _ := o.alerts.(admin.RecentAlerts)
	adm, err := admin.New(e.edge, admin.Deps{Operator: op, Alerts: recent, ServiceRefusals: o.service, AdminToken: o.adminToken, Logger: log, Now: o.clock})
	if err != nil {
		e.t.Fatal(err)
	}
	e.adm = adm
	e.admin = httptest.NewServer(adm.Handler())
	e.t.Cleanup(e.admin.Close)
}

// openInvites gives e its invite key, codes and limits, on e's database.
func (e *env) openInvites(o envOptions) {
	e.t.Helper()
	var err error
	if e.inviteKey, err = invites.NewKey([]byte("a server secret for the tests")); err != nil {
		e.t.Fatal(err)
	}
	if e.invites, err = invites.NewCodes(e.db, invites.Options{Now: o.clock, Key: e.inviteKey}); err != nil {
		e.t.Fatal(err)
	}
	if e.inviteLimits, err = invites.LoadLimits(e.db, o.invites, e.now); err != nil {
		e.t.Fatal(err)
	}
}

// ledgerOverride is the database with another budget ledger.
type ledgerOverride struct {
	*storage.DB
	budget.Ledger
}

func (l ledgerOverride) Lease(ctx context.Context, day string, calls, microUSD int64, giveBack ...budget.LedgerDay) error {
	return l.Ledger.Lease(ctx, day, calls, microUSD, giveBack...)
}

func (l ledgerOverride) Settle(ctx context.Context, s budget.Settlement) error {
	return l.Ledger.Settle(ctx, s)
}

// syncWriter lets concurrent log writes share one buffer.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (e *env) newKey(user, plan string) string {
	e.t.Helper()
	secret, _, err := e.keys.Create(user, plan)
	if err != nil {
		e.t.Fatal(err)
	}
	return secret
}

// keyOf returns the id of user's one key.
func (e *env) keyOf(user string) string {
	e.t.Helper()
	list, err := e.keys.List()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, k := range list {
		if k.UserID == user {
			return k.ID
		}
	}
	e.t.Fatalf("no key of %s in %+v", user, list)
	return ""
}

// post sends body to /v1/ocr with the given content type and key.
func (e *env) post(key, contentType string, body []byte) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.http.URL+"/v1/ocr", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return do(e.t, req)
}

func do(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// pngBytes encodes a w×h PNG.
func pngBytes(t testing.TB, w, h int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type okBody struct {
	Serials  []string      `json:"serials"`
	Rejected []string      `json:"rejected"`
	Quota    quotaResponse `json:"quota"`
	Model    string        `json:"model"`
}

func decodeOK(t testing.TB, resp *http.Response, data []byte) okBody {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", resp.StatusCode, data)
	}
	var b okBody
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return b
}

// usedOnDisk is alice's durable count this month.
func (e *env) usedOnDisk(user string) int64 {
	e.t.Helper()
	used, err := e.db.QuotaUsed(budget.MonthKey(e.now, e.loc))
	if err != nil {
		e.t.Fatal(err)
	}
	return used[user]
}

func TestOCRHappyPath(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 64, 32))
	b := decodeOK(t, resp, data)
	if got, want := strings.Join(b.Serials, ","), "SN-12345,SN-67890"; got != want {
		t.Errorf("serials %q, want %q", got, want)
	}
	if b.Rejected == nil || len(b.Rejected) != 0 {
		t.Errorf("rejected %v, want []", b.Rejected)
	}
	if got, want := b.Quota, (quotaResponse{Limit: 100, Used: 1, Remaining: 99}); got != want {
		t.Errorf("quota %+v, want %+v", got, want)
	}
	if resp.Header.Get("X-Request-ID") == "" {
		t.Error("no X-Request-ID")
	}
	if got := e.gemini.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
	if got := e.usedOnDisk("alice"); got != 1 {
		t.Errorf("quota on disk %d, want 1", got)
	}
	rows, err := e.db.Usage(e.now.Add(-time.Hour), e.now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d usage rows, want 1", len(rows))
	}
	r := rows[0]
	if r.UserID != "alice" || r.PromptTokens != 298 || r.CandidatesTokens != 24 || r.RequestID != resp.Header.Get("X-Request-ID") || r.KeyID == "" || r.CostMicroUSD <= 0 {
		t.Errorf("usage row %+v", r)
	}
}

func TestOCRMultipart(t *testing.T) {
	e := newEnv(t, envOptions{})
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("note", "ignored")
	fw, err := mw.CreateFormFile("image", "label.png")
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(pngBytes(t, 40, 40))
	mw.Close()
	resp, data := e.post(e.key, mw.FormDataContentType(), body.Bytes())
	decodeOK(t, resp, data)

	// No "image" field: 400, no upstream call.
	body.Reset()
	mw = multipart.NewWriter(&body)
	_ = mw.WriteField("picture", "x")
	mw.Close()
	resp, data = e.post(e.key, mw.FormDataContentType(), body.Bytes())
	edgetest.DecodeProblem(t, resp, data, http.StatusBadRequest, "missing_image")
	if got := e.gemini.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
}

func TestUnauthorizedBodiesIdentical(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := pngBytes(t, 8, 8)
	revoked := e.newKey("bob", "")
	if _, err := e.keys.Revoke(e.keyOf("bob")); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, header string }{
		{"missing", ""},
		{"wrong key", "Bearer bw_" + strings.Repeat("A", 32)},
		{"malformed", "Bearer not-a-key"},
		{"basic scheme", "Basic " + e.key},
		{"revoked", "Bearer " + revoked},
		{"key with suffix", "Bearer " + e.key + "x"},
	}
	var first []byte
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/v1/ocr", bytes.NewReader(img))
			req.Header.Set("Content-Type", "image/png")
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			resp, data := do(t, req)
			edgetest.DecodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")
			if first == nil {
				first = data
			} else if !bytes.Equal(first, data) {
				t.Errorf("body %s differs from %s", data, first)
			}
		})
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("upstream calls %d, want 0", got)
	}
	// The good key still works, and revoking it takes effect on the next request.
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	if _, err := e.keys.Revoke(e.keyOf("alice")); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")
}

func TestInputRefusedWithoutUpstreamCall(t *testing.T) {
	e := newEnv(t, envOptions{cfg: func(c *edge.Config) { c.MaxImageBytes = 4096; c.MaxImagePixels = 10_000 }})
	small := pngBytes(t, 20, 20)
	// A PNG header that claims 100000×100000 pixels with nothing behind it.
	huge := pngBytes(t, 1, 1)
	copy(huge[16:24], []byte{0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0})
	binary.BigEndian.PutUint32(huge[29:33], crc32.ChecksumIEEE(huge[12:29])) // IHDR's CRC
	gif := []byte("GIF89a\x01\x00\x01\x00\x00\x00\x00;")
	cases := []struct {
		name        string
		contentType string
		body        []byte
		status      int
		code        string
	}{
		{"too large", "image/png", append(pngBytes(t, 20, 20), make([]byte, 5000)...), 413, "body_too_large"},
		{"gif", "image/gif", gif, 415, "unsupported_media_type"},
		{"png declared jpeg", "image/jpeg", small, 415, "unsupported_media_type"},
		{"text", "text/plain", []byte("hello"), 415, "unsupported_media_type"},
		{"truncated png", "image/png", small[:20], 422, "undecodable_image"},
		{"too many pixels", "image/png", pngBytes(t, 200, 200), 422, "too_many_pixels"},
		{"huge header", "image/png", huge, 422, "too_many_pixels"},
		{"empty", "image/png", nil, 400, "missing_image"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, data := e.post(e.key, c.contentType, c.body)
			edgetest.DecodeProblem(t, resp, data, c.status, c.code)
		})
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("upstream calls %d, want 0", got)
	}
	if got := e.quotas.Used("alice", time.Now()); got != 0 {
		t.Errorf("quota used %d, want 0", got)
	}
}

// TestThinImageRefusedBeforeTheBudget: a 33-byte PNG header claiming
// 1 × 40,000,000 pixels is within max_image_pixels but would be 52,084
// tiles, about $4 of worst case to reserve per request. The side limit
// refuses it before anything is reserved.
func TestThinImageRefusedBeforeTheBudget(t *testing.T) {
	e := newEnv(t, envOptions{budget: budget.Config{DailyUSD: 10}})
	thin := pngBytes(t, 1, 1)
	binary.BigEndian.PutUint32(thin[16:20], 1)
	binary.BigEndian.PutUint32(thin[20:24], 40_000_000)
	binary.BigEndian.PutUint32(thin[29:33], crc32.ChecksumIEEE(thin[12:29])) // IHDR's CRC
	for range 3 {
		resp, data := e.post(e.key, "image/png", thin)
		edgetest.DecodeProblem(t, resp, data, http.StatusUnprocessableEntity, "too_many_pixels")
	}
	if st := e.brake.Status(time.Now()); st.Requests != 0 || st.SpendMicroUSD != 0 {
		t.Errorf("budget after refused images: %d calls, %d µ$; want nothing reserved", st.Requests, st.SpendMicroUSD)
	}
	// The longest side accepted costs at most cents at the default prices.
	wide := pngBytes(t, 8192, 1)
	resp, data := e.post(e.key, "image/png", wide)
	decodeOK(t, resp, data)
	if st := e.brake.Status(time.Now()); st.SpendMicroUSD > 10_000 {
		t.Errorf("an 8192 × 1 image spent %d µ$", st.SpendMicroUSD)
	}
}

// TestBodyLimitWithoutContentLength streams a body with no declared length:
// the limit must hold while reading.
//
// The body is sent chunked from a goroutine of its own over a connection
// of the test's, and the answer read meanwhile: the server answers and
// closes while the rest of the megabyte is still coming, so a client that
// reads only after its write has ended may see the write reset instead of
// the answer (Go's client did, about once in 150 runs).
func TestBodyLimitWithoutContentLength(t *testing.T) {
	e := newEnv(t, envOptions{cfg: func(c *edge.Config) { c.MaxImageBytes = 4096 }})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.http.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	img := pngBytes(t, 20, 20)
	go func() {
		w := bufio.NewWriter(conn)
		fmt.Fprintf(w, "POST /v1/ocr HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n", e.key)
		cw := httputil.NewChunkedWriter(w)
		_, _ = cw.Write(img)
		for range 64 {
			if _, err := cw.Write(make([]byte, 16<<10)); err != nil {
				return // the server has answered and closed: expected
			}
		}
		_ = cw.Close()
		_, _ = io.WriteString(w, "\r\n")
		_ = w.Flush()
	}()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to an over-long chunked body: %v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	edgetest.DecodeProblem(t, resp, data, http.StatusRequestEntityTooLarge, "body_too_large")
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("upstream calls %d, want 0", got)
	}
}

func TestQuotaRaceOneSlotLeft(t *testing.T) {
	e := newEnv(t, envOptions{quota: 3, cfg: func(c *edge.Config) { c.MaxInFlightPerUser = 20 }}) // all 20 race for the slot
	img := pngBytes(t, 16, 16)
	for range 2 {
		resp, data := e.post(e.key, "image/png", img)
		decodeOK(t, resp, data)
	}
	e.gemini.calls.Store(0)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, data := e.post(e.key, "image/png", img)
			switch resp.StatusCode {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				if resp.Header.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After: %s", data)
				}
				refused.Add(1)
			default:
				t.Errorf("status %d: %s", resp.StatusCode, data)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || refused.Load() != 19 {
		t.Errorf("%d ok and %d refused, want 1 and 19", ok.Load(), refused.Load())
	}
	if got := e.gemini.calls.Load(); got != 1 {
		t.Errorf("upstream calls %d, want 1", got)
	}
	if got := e.usedOnDisk("alice"); got != 3 {
		t.Errorf("quota on disk %d, want 3", got)
	}
	resp, data := e.post(e.key, "image/png", img)
	p := edgetest.DecodeProblem(t, resp, data, http.StatusTooManyRequests, "quota_exceeded")
	if strings.Contains(p.Detail, "3") {
		t.Errorf("detail %q should not need numbers", p.Detail)
	}
}

// failingUsage is a usage recorder whose disk always refuses.
type failingUsage struct{ calls atomic.Int64 }

func (f *failingUsage) RecordUsage(context.Context, string, budget.UsageRecord, budget.Settlement) error {
	f.calls.Add(1)
	return fmt.Errorf("write usage: %w", io.ErrShortWrite)
}

func TestFailClosedWhenUsageCannotBeRecorded(t *testing.T) {
	fu := &failingUsage{}
	e := newEnv(t, envOptions{usage: fu})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "usage_unavailable")
	if bytes.Contains(data, []byte("SN-12345")) {
		t.Errorf("result leaked in %s", data)
	}
	if fu.calls.Load() != 1 || e.gemini.calls.Load() != 1 {
		t.Errorf("record calls %d, upstream calls %d, want 1 and 1", fu.calls.Load(), e.gemini.calls.Load())
	}
	if got := e.quotas.Used("alice", time.Now()); got != 0 {
		t.Errorf("quota used %d, want 0", got)
	}
	if got := e.usedOnDisk("alice"); got != 0 {
		t.Errorf("quota on disk %d, want 0", got)
	}
}

// flakyUsage records through the database unless failing is set.
type flakyUsage struct {
	db      *storage.DB
	failing atomic.Bool
}

func (f *flakyUsage) RecordUsage(ctx context.Context, month string, rec budget.UsageRecord, s budget.Settlement) error {
	if f.failing.Load() {
		return fmt.Errorf("write usage: %w", io.ErrShortWrite)
	}
	return f.db.RecordUsage(ctx, month, rec, s)
}

// TestUsageFailurePausesPaidCalls: after a usage record fails (a full or
// failing disk), new requests are refused before the upstream call for
// usagePause, so the service stops paying for reads it must withhold. Then
// one request alone goes through as a probe, however many arrive: it fails
// and starts the next pause, or succeeds and ends it.
func TestUsageFailurePausesPaidCalls(t *testing.T) {
	fu := &flakyUsage{}
	fu.failing.Store(true)
	clk := newClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, envOptions{usage: fu, clock: clk.now})
	fu.db = e.db
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "usage_unavailable")
	for range 5 {
		resp, data = e.post(e.key, "image/png", img)
		edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "usage_unavailable")
		if ra := resp.Header.Get("Retry-After"); ra != "10" {
			t.Errorf("Retry-After %q, want 10", ra)
		}
	}
	if got := e.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls while records fail, want 1", got)
	}
	if got := e.attempts.Count("alice", clk.now()); got != 1 {
		t.Errorf("%d attempts counted, want 1 (refusals count nothing)", got)
	}

	// The pause is over: of 20 requests at once, one is the probe.
	clk.add(guard.UsagePause)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			resp, data := e.post(e.key, "image/png", img)
			edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "usage_unavailable")
		})
	}
	wg.Wait()
	if got := e.gemini.calls.Load(); got != 2 {
		t.Errorf("%d upstream calls after the pause, want 2 (one probe)", got)
	}

	// The disk is back: the next probe's record ends the pause for all.
	fu.failing.Store(false)
	clk.add(guard.UsagePause)
	for range 3 {
		resp, data = e.post(e.key, "image/png", img)
		decodeOK(t, resp, data)
	}
	if got := e.gemini.calls.Load(); got != 5 {
		t.Errorf("%d upstream calls once records work, want 5", got)
	}
}

// TestFailClosedOnClosedDatabase makes the real storage path fail: the
// database is closed under the running server.
func TestFailClosedOnClosedDatabase(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	if err := e.db.Close(); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "usage_unavailable")
	if bytes.Contains(data, []byte("SN-")) {
		t.Errorf("result leaked in %s", data)
	}
	if got := e.quotas.Used("alice", time.Now()); got != 1 {
		t.Errorf("quota used in memory %d, want 1", got)
	}
	db, err := storage.Open(filepath.Join(e.dir, "bw.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	used, _ := db.QuotaUsed(budget.MonthKey(e.now, e.loc))
	rows, _ := db.Usage(e.now.Add(-time.Hour), e.now.Add(time.Hour))
	if used["alice"] != 1 || len(rows) != 1 {
		t.Errorf("on disk: quota %d and %d rows, want 1 and 1", used["alice"], len(rows))
	}
}

func TestRestartKeepsQuota(t *testing.T) {
	dir := t.TempDir()
	gemini := newFakeGemini(t)
	e := newEnv(t, envOptions{dir: dir, gemini: gemini, quota: 5})
	img := pngBytes(t, 16, 16)
	for range 2 {
		resp, data := e.post(e.key, "image/png", img)
		decodeOK(t, resp, data)
	}
	key := e.key
	e.http.Close()
	e.events.Close(context.Background())
	e.db.Close()

	e2 := newEnv(t, envOptions{dir: dir, gemini: gemini, quota: 5})
	resp, data := e2.post(key, "image/png", img)
	if got := decodeOK(t, resp, data).Quota; got.Used != 3 || got.Remaining != 2 {
		t.Errorf("after restart quota %+v, want used 3 remaining 2", got)
	}
}

func TestUpstreamFailureReleasesSlot(t *testing.T) {
	cases := []struct {
		name    string
		respond func(w http.ResponseWriter, r *http.Request)
		calls   int64
		timeout time.Duration // long enough for the one retry where one is due
	}{
		{"503 twice", func(w http.ResponseWriter, r *http.Request) { writeUpstreamError(w, 503, "UNAVAILABLE") }, 2, 5 * time.Second},
		{"429 twice", func(w http.ResponseWriter, r *http.Request) { writeUpstreamError(w, 429, "RESOURCE_EXHAUSTED") }, 2, 5 * time.Second},
		{"500 once", func(w http.ResponseWriter, r *http.Request) { writeUpstreamError(w, 500, "INTERNAL") }, 1, 0},
		{"bad key", func(w http.ResponseWriter, r *http.Request) {
			writeUpstreamError(w, 400, "INVALID_ARGUMENT") // message is "upstream says no"; see below for the key case
		}, 1, 0},
		{"timeout", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, 1, 300 * time.Millisecond},
		{"not json", func(w http.ResponseWriter, r *http.Request) { writeModelText(w, "I see SN-1 and SN-2") }, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOptions{timeout: c.timeout})
			e.gemini.set(c.respond)
			resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
			p := edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
			if strings.Contains(string(data), "upstream says no") || strings.Contains(p.Detail, geminiKey) {
				t.Errorf("upstream text leaked: %s", data)
			}
			if got := e.gemini.calls.Load(); got != c.calls {
				t.Errorf("upstream calls %d, want %d", got, c.calls)
			}
			if got := e.quotas.Used("alice", time.Now()); got != 0 {
				t.Errorf("quota used %d, want 0", got)
			}
			// The slot is free again: a later success counts as the first.
			e.gemini.set(nil)
			resp, data = e.post(e.key, "image/png", pngBytes(t, 16, 16))
			if got := decodeOK(t, resp, data).Quota.Used; got != 1 {
				t.Errorf("used after recovery %d, want 1", got)
			}
		})
	}
}

func TestWrongGeminiKeyIsLogged(t *testing.T) {
	logs := &bytes.Buffer{}
	e := newEnv(t, envOptions{logTo: logs})
	e.gemini.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		io.WriteString(w, `{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT"}}`)
	})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
	time.Sleep(10 * time.Millisecond) // let the log line land; nothing waits on a window here
	if !strings.Contains(logs.String(), "GEMINI_API_KEY was refused") {
		t.Errorf("log lacks the key refusal:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), geminiKey) || strings.Contains(string(data), geminiKey) {
		t.Error("the Gemini key leaked")
	}
}

func TestMalformedModelOutput(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.gemini.set(func(w http.ResponseWriter, r *http.Request) {
		writeModelText(w, `{"serials":["SN-12345"," SN-777 ","drop table users;",42,null,{"a":1},"sn-lower","SN-12345"]}`)
	})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 16, 16))
	b := decodeOK(t, resp, data)
	if got, want := strings.Join(b.Serials, ","), "SN-12345,SN-777"; got != want {
		t.Errorf("serials %q, want %q", got, want)
	}
	for _, want := range []string{"drop table users;", "42", "sn-lower"} {
		found := false
		for _, r := range b.Rejected {
			found = found || r == want
		}
		if !found {
			t.Errorf("rejected %q lacks %q", b.Rejected, want)
		}
	}
}

func TestNotFoundIsProblem(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp, data := do(t, mustRequest(t, http.MethodGet, e.http.URL+"/v1/nope", ""))
	edgetest.DecodeProblem(t, resp, data, http.StatusNotFound, "not_found")
	resp, data = do(t, mustRequest(t, http.MethodGet, e.http.URL+"/v1/ocr", ""))
	edgetest.DecodeProblem(t, resp, data, http.StatusMethodNotAllowed, "method_not_allowed")
	resp, data = do(t, mustRequest(t, http.MethodGet, e.http.URL+"/api/keys", testAdminToken))
	edgetest.DecodeProblem(t, resp, data, http.StatusNotFound, "not_found") // no admin route on the public listener
	resp, _ = do(t, mustRequest(t, http.MethodGet, e.http.URL+"/healthz", ""))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz %d", resp.StatusCode)
	}
}

func mustRequest(t *testing.T, method, url, token string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// TestRefusalDoesNotWaitForTheBody: a request refused before its body is
// read (no key, over a limit) is answered at once, even if the body it
// declares never arrives. Go's server would otherwise wait to drain up to
// 256 KiB of it, until the read timeout, holding the connection open.
func TestRefusalDoesNotWaitForTheBody(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, head := range []string{
		"Content-Length: 5000000\r\n",
		"Authorization: Bearer bw_nope\r\nContent-Length: 5000000\r\n",
		"Transfer-Encoding: chunked\r\n", // length unknown: the connection is closed
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.http.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n%s\r\n", head)
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer while the body is missing: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("status %d, want 401", resp.StatusCode)
		}
	}
	// A refused request whose small body came with it keeps its connection.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var conns atomic.Int64
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			conns.Add(1)
		}
	}}
	for range 3 {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, e.http.URL+"/v1/ocr",
			bytes.NewReader(pngBytes(t, 16, 16)))
		req.Header.Set("Content-Type", "image/png")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 refused requests with their bodies, want 1 (kept alive)", n)
	}
}

// TestTwoAuthorizationHeadersRefused: with two Authorization headers a
// proxy and the server might each believe another; both orders get 401.
func TestTwoAuthorizationHeadersRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, pair := range [][2]string{{e.key, "bw_bogus"}, {"bw_bogus", e.key}} {
		req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/v1/ocr", bytes.NewReader(pngBytes(t, 16, 16)))
		req.Header.Set("Content-Type", "image/png")
		req.Header.Add("Authorization", "Bearer "+pair[0])
		req.Header.Add("Authorization", "Bearer "+pair[1])
		resp, data := do(t, req)
		edgetest.DecodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("%d upstream calls, want 0", got)
	}
	resp, err := http.Head(e.http.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD /healthz: %d, want 200", resp.StatusCode)
	}
}

// TestRequestIDs: ids share the process's prefix, never repeat, and are no
// counter (two in a row do not tell the traffic in between).
func TestRequestIDs(t *testing.T) {
	e := newEnv(t, envOptions{})
	seen := map[string]bool{}
	var prefix string
	for i := range 200 {
		resp, err := http.Get(e.http.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		id := resp.Header.Get("X-Request-ID")
		p, rest, ok := strings.Cut(id, "-")
		if !ok || rest == "" || seen[id] {
			t.Fatalf("request %d: id %q malformed or repeated", i, id)
		}
		if prefix == "" {
			prefix = p
		} else if p != prefix {
			t.Fatalf("prefix %q, then %q", prefix, p)
		}
		seen[id] = true
	}
	var ids []uint64
	for id := range seen {
		_, rest, _ := strings.Cut(id, "-")
		n, err := strconv.ParseUint(rest, 36, 64)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n)
	}
	slices.Sort(ids)
	if ids[len(ids)-1]-ids[0] < 1<<40 { // 200 counter values would span 200
		t.Errorf("ids span only %d: a counter", ids[len(ids)-1]-ids[0])
	}
}

// writeBehind is the write-behind of e's defense state into store, with the
// snapshots the App registers.
func (e *env) writeBehind(store state.StateStore) *state.WriteBehind {
	e.t.Helper()
	snapshots := append([]state.Snapshot{
		state.Windows(state.StateUserWindows, guard.LayerRate, e.windows),
		state.Attempts(guard.LayerAttempts, e.attempts),
		state.Refusals(RefusalCountsLayer, e.edge.DirtyRefusals),
	}, e.inviteLimits.Snapshots()...)
	wb, err := state.NewWriteBehind(store, snapshots, state.Options{FailedOpen: e.srv.FailedOpen, Now: e.srv.now})
	if err != nil {
		e.t.Fatal(err)
	}
	return wb
}
