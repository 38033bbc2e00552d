package ocr

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

const testKey = "AIzaTEST-not-a-real-key-0123456789"

// testImage is what the fake expects to receive, base64-encoded.
var testImage = Image{Data: []byte("\x89PNG\r\n\x1a\n pretend pixels \x00\xff"), MIME: MIMEPNG, Width: 3, Height: 2}

// reply is one canned answer of the fake Gemini.
type reply struct {
	status int
	file   string // under testdata/
	body   string // used when file is ""
}

func (rp reply) bytes(tb testing.TB) []byte {
	tb.Helper()
	if rp.file == "" {
		return []byte(rp.body)
	}
	data, err := os.ReadFile(filepath.Join("testdata", rp.file))
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// fakeGemini is an httptest server that checks every request against the
// wire format and answers with replies in turn (the last one repeats).
type fakeGemini struct {
	*httptest.Server
	calls   atomic.Int32
	mu      sync.Mutex
	lastReq []byte
}

func newFakeGemini(t *testing.T, wantMaxOutput int, replies ...reply) *fakeGemini {
	t.Helper()
	f := &fakeGemini{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(f.calls.Add(1))
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read request body: %v", err)
		}
		f.mu.Lock()
		f.lastReq = body
		f.mu.Unlock()
		checkRequest(t, r, body, wantMaxOutput)
		rp := replies[min(n, len(replies))-1]
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.WriteHeader(rp.status)
		w.Write(rp.bytes(t))
	}))
	t.Cleanup(f.Close)
	return f
}

// checkRequest checks one request to DefaultModel against the REST API's
// wire format.
func checkRequest(t *testing.T, r *http.Request, body []byte, wantMaxOutput int) {
	t.Helper()
	if got, want := r.Method, http.MethodPost; got != want {
		t.Errorf("method = %q, want %q", got, want)
	}
	if got, want := r.URL.EscapedPath(), "/v1beta/models/"+DefaultModel+":generateContent"; got != want {
		t.Errorf("path = %q, want %q", got, want)
	}
	if r.URL.RawQuery != "" {
		t.Errorf("query = %q, want none (the key goes in a header)", r.URL.RawQuery)
	}
	if got := r.Header.Get("x-goog-api-key"); got != testKey {
		t.Errorf("x-goog-api-key = %q, want the test key", got)
	}
	if got, want := r.Header.Get("Content-Type"), "application/json"; got != want {
		t.Errorf("Content-Type = %q, want %q", got, want)
	}

	var req struct {
		Contents []struct {
			Role  string `json:"role"`
			Parts []struct {
				InlineData *struct {
					MIMEType string `json:"mimeType"`
					Data     string `json:"data"`
				} `json:"inlineData"`
				Text string `json:"text"`
			} `json:"parts"`
		} `json:"contents"`
		GenerationConfig struct {
			ResponseMIMEType string          `json:"responseMimeType"`
			ResponseSchema   json.RawMessage `json:"responseSchema"`
			MaxOutputTokens  *int            `json:"maxOutputTokens"`
			ThinkingConfig   struct {
				ThinkingBudget *int `json:"thinkingBudget"`
			} `json:"thinkingConfig"`
		} `json:"generationConfig"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Errorf("request body is not JSON: %v", err)
		return
	}
	if len(req.Contents) != 1 || req.Contents[0].Role != "user" || len(req.Contents[0].Parts) != 2 {
		t.Errorf("contents = %s, want one user content with two parts", body)
		return
	}
	parts := req.Contents[0].Parts
	if parts[0].InlineData == nil {
		t.Errorf("parts[0] has no inlineData")
	} else {
		if got, want := parts[0].InlineData.MIMEType, testImage.MIME; got != want {
			t.Errorf("inlineData.mimeType = %q, want %q", got, want)
		}
		data, err := base64.StdEncoding.DecodeString(parts[0].InlineData.Data)
		if err != nil || !bytes.Equal(data, testImage.Data) {
			t.Errorf("inlineData.data = %q (%v), want the image in standard base64", parts[0].InlineData.Data, err)
		}
	}
	if !strings.Contains(parts[1].Text, "serial number") || !strings.Contains(parts[1].Text, "JSON") {
		t.Errorf("parts[1].text = %q, want a prompt asking for serial numbers as JSON", parts[1].Text)
	}
	gc := req.GenerationConfig
	if got, want := gc.ResponseMIMEType, "application/json"; got != want {
		t.Errorf("responseMimeType = %q, want %q", got, want)
	}
	if got, want := string(gc.ResponseSchema), `{"type":"OBJECT","properties":{"serials":{"type":"ARRAY","items":{"type":"STRING"}}},"required":["serials"]}`; got != want {
		t.Errorf("responseSchema = %s, want %s", got, want)
	}
	if gc.MaxOutputTokens == nil || *gc.MaxOutputTokens != wantMaxOutput {
		t.Errorf("maxOutputTokens = %v, want %d", gc.MaxOutputTokens, wantMaxOutput)
	}
	// DefaultModel is of Gemini 3 or later: media_resolution and a
	// thinking level, never a budget beside it.
	w := wireOf(t, body)
	if got, want := w.partLevel+" "+w.globalLevel+" "+w.thinkingLevel, "MEDIA_RESOLUTION_HIGH MEDIA_RESOLUTION_HIGH minimal"; got != want {
		t.Errorf("part mediaResolution, generationConfig.mediaResolution, thinkingLevel = %q, want %q", got, want)
	}
	if w.hasBudget {
		t.Errorf("thinkingConfig.thinkingBudget sent beside thinkingLevel: %s", body)
	}
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newTestGemini returns a client of baseURL whose sleeps are recorded, not
// slept.
func newTestGemini(t *testing.T, cfg Config, baseURL string) (*Gemini, *[]time.Duration, *logBuffer) {
	t.Helper()
	cfg.BaseURL = baseURL
	logs := &logBuffer{}
	g, err := NewGemini(cfg, testKey, nil, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("NewGemini: %v", err)
	}
	var slept []time.Duration
	g.sleep = func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		return ctx.Err()
	}
	return g, &slept, logs
}

// upstreamError asserts that err is an *UpstreamError that leaks neither
// the key nor upstream text.
func upstreamError(t *testing.T, err error) *UpstreamError {
	t.Helper()
	var ue *UpstreamError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v (%T), want *UpstreamError", err, err)
	}
	for _, leak := range []string{testKey, "quota", "overloaded", "internal error", "not valid", "invalid argument", "unregistered", "SN-"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("error text %q contains %q", err.Error(), leak)
		}
	}
	return ue
}

func TestGeminiReadOK(t *testing.T) {
	fake := newFakeGemini(t, DefaultMaxOutputTokens, reply{status: 200, file: "ok.json"})
	g, slept, _ := newTestGemini(t, Config{}, fake.URL)

	res, err := g.Read(t.Context(), testImage, alwaysRetry)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got, want := fmt.Sprint(res.Serials), "[SN-12345 A1B2C3D4]"; got != want {
		t.Errorf("Serials = %s, want %s", got, want)
	}
	if got, want := fmt.Sprintf("%q", res.Rejected), `["S/N" "serial 99"]`; got != want {
		t.Errorf("Rejected = %s, want %s", got, want)
	}
	if got, want := res.Usage, (Usage{PromptTokens: 1160, CandidatesTokens: 24, ThoughtsTokens: 12}); got != want {
		t.Errorf("Usage = %+v, want %+v", got, want)
	}
	if got, want := res.Model, DefaultModel; got != want {
		t.Errorf("Model = %q, want %q", got, want)
	}
	if res.Simulated {
		t.Error("Simulated = true, want false")
	}
	if got, want := fake.calls.Load(), int32(1); got != want {
		t.Errorf("calls = %d, want %d", got, want)
	}
	if len(*slept) != 0 {
		t.Errorf("slept %v, want no sleep", *slept)
	}

	// The whole request body, as sent, is a golden file.
	var indented bytes.Buffer
	fake.mu.Lock()
	err = json.Indent(&indented, fake.lastReq, "", "  ")
	fake.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	indented.WriteByte('\n')
	golden := filepath.Join("testdata", "request.golden.json")
	if *update {
		if err := os.WriteFile(golden, indented.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./ocr/ -run TestGeminiReadOK -update)", err)
	}
	if got := indented.String(); got != string(want) {
		t.Errorf("request body differs from %s:\n%s", golden, got)
	}
}

func TestGeminiReadMaxOutputTokensSent(t *testing.T) {
	fake := newFakeGemini(t, 123, reply{status: 200, file: "ok_empty.json"})
	g, _, _ := newTestGemini(t, Config{Price: Price{MaxOutputTokens: 123}}, fake.URL)
	res, err := g.Read(t.Context(), testImage, alwaysRetry)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if res.Serials == nil || len(res.Serials) != 0 {
		t.Errorf("Serials = %#v, want empty and non-nil", res.Serials)
	}
}

func TestGeminiReadStatus(t *testing.T) {
	for _, tt := range []struct {
		name       string
		replies    []reply
		wantCalls  int32
		wantStatus int    // 0: success
		wantReason string // of the error
	}{
		{"429 then ok", []reply{{429, "err_429.json", ""}, {200, "ok.json", ""}}, 2, 0, ""},
		{"503 then ok", []reply{{503, "err_503.json", ""}, {200, "ok.json", ""}}, 2, 0, ""},
		{"503 twice", []reply{{503, "err_503.json", ""}, {503, "err_503.json", ""}}, 2, 503, "UNAVAILABLE"},
		{"429 then 503", []reply{{429, "err_429.json", ""}, {503, "err_503.json", ""}}, 2, 503, "UNAVAILABLE"},
		{"429 twice", []reply{{429, "err_429.json", ""}}, 2, 429, ReasonRateLimited},
		{"500 not retried", []reply{{500, "err_500.json", ""}, {200, "ok.json", ""}}, 1, 500, "INTERNAL"},
		{"400 not retried", []reply{{400, "err_400_invalid.json", ""}, {200, "ok.json", ""}}, 1, 400, "INVALID_ARGUMENT"},
		{"504 not retried", []reply{{504, "", `{"error":{"code":504,"status":"DEADLINE_EXCEEDED"}}`}}, 1, 504, "DEADLINE_EXCEEDED"},
		{"404 html body", []reply{{404, "", "<html>not found</html>"}}, 1, 404, ReasonUnknown},
		{"status word not a word", []reply{{500, "", `{"error":{"status":"internal error: <b>boom</b>"}}`}}, 1, 500, ReasonUnknown},
		{"redirect not followed", []reply{{307, "", ""}}, 1, 307, ReasonUnknown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeGemini(t, DefaultMaxOutputTokens, tt.replies...)
			g, slept, _ := newTestGemini(t, Config{}, fake.URL)

			res, err := g.Read(t.Context(), testImage, alwaysRetry)
			if got := fake.calls.Load(); got != tt.wantCalls {
				t.Errorf("calls = %d, want %d", got, tt.wantCalls)
			}
			if wantSleeps := int(tt.wantCalls) - 1; len(*slept) != wantSleeps {
				t.Errorf("slept %v, want %d sleeps", *slept, wantSleeps)
			}
			if tt.wantStatus == 0 {
				if err != nil {
					t.Fatalf("Read: %v", err)
				}
				if len(res.Serials) == 0 {
					t.Errorf("no serials after retry")
				}
				return
			}
			ue := upstreamError(t, err)
			if ue.Status != tt.wantStatus || ue.Reason != tt.wantReason {
				t.Errorf("error = %d %q, want %d %q", ue.Status, ue.Reason, tt.wantStatus, tt.wantReason)
			}
			if errors.Is(err, ErrKeyRefused) {
				t.Errorf("errors.Is(err, ErrKeyRefused) = true")
			}
		})
	}
}

func TestGeminiReadRedirectKeepsKey(t *testing.T) {
	var stolen atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stolen.Add(1)
	}))
	defer elsewhere.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	g, _, _ := newTestGemini(t, Config{}, redirect.URL)
	_, err := g.Read(t.Context(), testImage, alwaysRetry)
	if ue := upstreamError(t, err); ue.Status != http.StatusTemporaryRedirect {
		t.Errorf("Status = %d, want 307", ue.Status)
	}
	if n := stolen.Load(); n != 0 {
		t.Errorf("redirect target got %d requests, want 0", n)
	}
}

func TestGeminiReadNoRetryWithoutTime(t *testing.T) {
	fake := newFakeGemini(t, DefaultMaxOutputTokens, reply{429, "err_429.json", ""}, reply{200, "ok.json", ""})
	g, slept, _ := newTestGemini(t, Config{}, fake.URL)
	// The clock says the call has already used all but two seconds of its
	// 30 s, less than the delay and a retry need.
	g.now = func() time.Time { return time.Now().Add(DefaultTimeout - 2*time.Second) }

	_, err := g.Read(t.Context(), testImage, alwaysRetry)
	if ue := upstreamError(t, err); ue.Status != 429 || ue.Reason != ReasonRateLimited {
		t.Errorf("error = %d %q, want 429 rate_limited", ue.Status, ue.Reason)
	}
	if got := fake.calls.Load(); got != 1 {
		t.Errorf("calls = %d, want 1", got)
	}
	if len(*slept) != 0 {
		t.Errorf("slept %v, want none", *slept)
	}
}

func TestGeminiReadKeyRefused(t *testing.T) {
	for _, tt := range []struct {
		name  string
		reply reply
	}{
		{"400 API key not valid", reply{400, "err_400_key.json", ""}},
		{"400 reason only", reply{400, "", `{"error":{"code":400,"status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}`}},
		{"401", reply{401, "", ""}},
		{"403 PERMISSION_DENIED", reply{403, "err_403.json", ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeGemini(t, DefaultMaxOutputTokens, tt.reply, reply{200, "ok.json", ""})
			g, _, logs := newTestGemini(t, Config{}, fake.URL)

			_, err := g.Read(t.Context(), testImage, alwaysRetry)
			if !errors.Is(err, ErrKeyRefused) {
				t.Fatalf("err = %v, want ErrKeyRefused", err)
			}
			ue := upstreamError(t, err)
			if ue.Reason != ReasonAuth || ue.Status != tt.reply.status {
				t.Errorf("error = %d %q, want %d %q", ue.Status, ue.Reason, tt.reply.status, ReasonAuth)
			}
			if got := fake.calls.Load(); got != 1 {
				t.Errorf("calls = %d, want 1", got)
			}
			out := logs.String()
			if got := strings.Count(out, "GEMINI_API_KEY was refused"); got != 1 {
				t.Errorf("log has %d key refusals, want 1:\n%s", got, out)
			}
			if !strings.Contains(out, "level=ERROR") {
				t.Errorf("key refusal not logged at ERROR:\n%s", out)
			}
			if strings.Contains(out, testKey) {
				t.Errorf("log contains the key:\n%s", out)
			}
		})
	}
}

func TestGeminiReadTimeout(t *testing.T) {
	testDone := make(chan struct{})
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a client hanging up only once the body is read.
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-testDone:
		}
	}))
	defer fake.Close()
	defer close(testDone)
	g, _, _ := newTestGemini(t, Config{Timeout: 50 * time.Millisecond}, fake.URL)

	start := time.Now()
	res, err := g.Read(t.Context(), testImage, alwaysRetry)
	ue := upstreamError(t, err)
	if ue.Reason != ReasonTimeout || ue.Status != 0 {
		t.Errorf("error = %d %q, want 0 %q", ue.Status, ue.Reason, ReasonTimeout)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(err, context.DeadlineExceeded) = false for %v", err)
	}
	if res.Usage != (Usage{}) {
		t.Errorf("Usage = %+v, want zero (unknown)", res.Usage)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Read took %v with a 50ms timeout", elapsed)
	}
}

func TestGeminiReadCanceled(t *testing.T) {
	fake := newFakeGemini(t, DefaultMaxOutputTokens, reply{200, "ok.json", ""})
	g, _, _ := newTestGemini(t, Config{}, fake.URL)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := g.Read(ctx, testImage, alwaysRetry)
	if ue := upstreamError(t, err); ue.Reason != ReasonCanceled {
		t.Errorf("Reason = %q, want %q", ue.Reason, ReasonCanceled)
	}
}

func TestGeminiReadTransport(t *testing.T) {
	fake := httptest.NewServer(http.NotFoundHandler())
	url := fake.URL
	fake.Close() // nothing listens there any more
	g, _, _ := newTestGemini(t, Config{}, url)
	_, err := g.Read(t.Context(), testImage, alwaysRetry)
	if ue := upstreamError(t, err); ue.Reason != ReasonTransport || ue.Status != 0 {
		t.Errorf("error = %d %q, want 0 %q", ue.Status, ue.Reason, ReasonTransport)
	}
}

// candidate wraps model text in a 200 response with usage 298/24.
func candidate(text, finish string) string {
	quoted, _ := json.Marshal(text)
	return fmt.Sprintf(`{"candidates":[{"content":{"parts":[{"text":%s}],"role":"model"},"finishReason":%q}],
		"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"totalTokenCount":322},"modelVersion":"gemini-2.5-flash-001"}`, quoted, finish)
}

// readOutputCase is one answer of the fake Gemini and what Read must make
// of it: an upstream error with wantReason, or the serials and rejects.
type readOutputCase struct {
	name         string
	reply        reply
	wantReason   string // "" for success
	wantUsage    Usage
	wantSerials  int
	wantRejected []string // nil: only the count below is checked
	wantNRej     int
}

// readOutputCases are the answers TestGeminiReadOutputs feeds to Read:
// malformed output, odd values, many items, finish reasons and bodies
// that are not what the REST API promises.
func readOutputCases() []readOutputCase {
	var many, manyBad []string
	for i := range 1000 {
		many = append(many, fmt.Sprintf("%q", fmt.Sprintf("SN-%04d", i)))
		manyBad = append(manyBad, fmt.Sprintf("%q", fmt.Sprintf("bad %d", i)))
	}
	usage := Usage{PromptTokens: 298, CandidatesTokens: 24}
	return []readOutputCase{
		{name: "not JSON", reply: reply{200, "", candidate("The serial is SN-12345.", "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "code fence", reply: reply{200, "", candidate("```json\n{\"serials\":[\"SN-12345\"]}\n```", "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "empty text", reply: reply{200, "", candidate("", "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "bare array", reply: reply{200, "", candidate(`["SN-12345"]`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "wrong key", reply: reply{200, "", candidate(`{"serial":["SN-12345"]}`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "extra key", reply: reply{200, "", candidate(`{"serials":["SN-12345"],"note":"x"}`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "serials a string", reply: reply{200, "", candidate(`{"serials":"SN-12345"}`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "serials null", reply: reply{200, "", candidate(`{"serials":null}`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "trailing text", reply: reply{200, "", candidate(`{"serials":["SN-12345"]} and more`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "two objects", reply: reply{200, "", candidate(`{"serials":[]}{"serials":[]}`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "deep nesting", reply: reply{200, "", candidate(`{"serials":[`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`]}`, "STOP")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{
			name:         "numbers and other values",
			reply:        reply{200, "", candidate(`{"serials":[12345, 1.5e300, -0, true, null, {"a": 1}, ["SN-1"], "  SN-12345  "]}`, "STOP")},
			wantUsage:    usage,
			wantSerials:  1,
			wantRejected: []string{"12345", "1.5e300", "-0", "true", "null", `{"a":1}`, `["SN-1"]`},
		},
		{
			name:         "huge strings",
			reply:        reply{200, "", candidate(`{"serials":["`+strings.Repeat("A", 100_000)+`","`+strings.Repeat("é", 1000)+`"]}`, "STOP")},
			wantUsage:    usage,
			wantRejected: []string{strings.Repeat("A", 64), strings.Repeat("é", 32)},
		},
		{
			name:         "control and odd characters",
			reply:        reply{200, "", candidate(`{"serials":["SN-1\u0000", "", "   ", "\ud800", "sn-12345", "SN 12345"]}`, "STOP")},
			wantUsage:    usage,
			wantRejected: []string{"SN-1\x00", "\uFFFD", "sn-12345", "SN 12345"},
		},
		{name: "duplicates", reply: reply{200, "", candidate(`{"serials":["SN-12345","SN-12345"," SN-12345","AB12"]}`, "STOP")}, wantUsage: usage, wantSerials: 2, wantRejected: []string{}},
		{name: "1000 valid items", reply: reply{200, "", candidate(`{"serials":[`+strings.Join(many, ",")+`]}`, "STOP")}, wantUsage: usage, wantSerials: maxSerials, wantNRej: maxRejected},
		{name: "1000 invalid items", reply: reply{200, "", candidate(`{"serials":[`+strings.Join(manyBad, ",")+`]}`, "STOP")}, wantUsage: usage, wantNRej: maxRejected},
		{name: "MAX_TOKENS cut", reply: reply{200, "max_tokens.json", ""}, wantReason: ReasonBadOutput, wantUsage: Usage{PromptTokens: 298, CandidatesTokens: 256}},
		{name: "MAX_TOKENS complete", reply: reply{200, "", candidate(`{"serials":["SN-12345"]}`, "MAX_TOKENS")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "SAFETY", reply: reply{200, "safety.json", ""}, wantReason: ReasonBlocked, wantUsage: Usage{PromptTokens: 298}},
		{name: "RECITATION", reply: reply{200, "", candidate(`{"serials":["SN-12345"]}`, "RECITATION")}, wantReason: ReasonBlocked, wantUsage: usage},
		{name: "OTHER", reply: reply{200, "", candidate(`{"serials":["SN-12345"]}`, "OTHER")}, wantReason: ReasonBadOutput, wantUsage: usage},
		{name: "prompt blocked", reply: reply{200, "prompt_blocked.json", ""}, wantReason: ReasonBlocked, wantUsage: Usage{PromptTokens: 298}},
		{name: "empty candidates", reply: reply{200, "empty_candidates.json", ""}, wantReason: ReasonBadOutput, wantUsage: Usage{PromptTokens: 298}},
		{name: "empty object", reply: reply{200, "", `{}`}, wantReason: ReasonBadOutput},
		{name: "body not JSON", reply: reply{200, "", `<html>proxy error</html>`}, wantReason: ReasonBadOutput},
		{name: "body truncated", reply: reply{200, "", candidate(`{"serials":[]}`, "STOP")[:80]}, wantReason: ReasonBadOutput},
		{name: "body too large", reply: reply{200, "", candidate(strings.Repeat(" ", maxResponseBytes), "STOP")}, wantReason: ReasonBadOutput},
		{
			name:       "candidates wrong type keeps usage",
			reply:      reply{200, "", `{"candidates":"nope","usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":7}}`},
			wantReason: ReasonBadOutput,
			wantUsage:  Usage{PromptTokens: 298, CandidatesTokens: 24, ThoughtsTokens: 7},
		},
		{
			name:       "negative usage",
			reply:      reply{200, "", `{"candidates":[],"usageMetadata":{"promptTokenCount":-5,"candidatesTokenCount":-1}}`},
			wantReason: ReasonBadOutput,
		},
		{
			name:         "thought parts skipped, text parts joined",
			reply:        reply{200, "", `{"candidates":[{"content":{"parts":[{"text":"I think SN-9","thought":true},{"text":"{\"serials\":"},{"text":"[\"SN-12345\"]}"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24}}`},
			wantUsage:    usage,
			wantSerials:  1,
			wantRejected: []string{},
		},
	}
}

func TestGeminiReadOutputs(t *testing.T) {
	for _, tt := range readOutputCases() {
		t.Run(tt.name, func(t *testing.T) { checkReadOutput(t, tt) })
	}
}

// checkReadOutput feeds tt's answer to Read through a fake Gemini, once,
// and checks the usage, the error or the serials and rejects.
func checkReadOutput(t *testing.T, tt readOutputCase) {
	fake := newFakeGemini(t, DefaultMaxOutputTokens, tt.reply)
	g, _, _ := newTestGemini(t, Config{}, fake.URL)

	res, err := g.Read(t.Context(), testImage, alwaysRetry)
	if got := fake.calls.Load(); got != 1 {
		t.Errorf("calls = %d, want 1", got)
	}
	if res.Usage != tt.wantUsage {
		t.Errorf("Usage = %+v, want %+v", res.Usage, tt.wantUsage)
	}
	if res.Model == "" {
		t.Errorf("Model is empty")
	}
	if tt.wantReason != "" {
		ue := upstreamError(t, err)
		if ue.Reason != tt.wantReason || ue.Status != 200 {
			t.Errorf("error = %d %q, want 200 %q", ue.Status, ue.Reason, tt.wantReason)
		}
		return
	}
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got := len(res.Serials); got != tt.wantSerials {
		t.Errorf("len(Serials) = %d, want %d: %q", got, tt.wantSerials, res.Serials)
	}
	for _, s := range res.Serials {
		if !g.pattern.MatchString(s) {
			t.Errorf("serial %q does not match the pattern", s)
		}
	}
	if tt.wantRejected != nil {
		if got, want := fmt.Sprintf("%q", res.Rejected), fmt.Sprintf("%q", tt.wantRejected); got != want {
			t.Errorf("Rejected = %s, want %s", got, want)
		}
	} else if got := len(res.Rejected); got != tt.wantNRej {
		t.Errorf("len(Rejected) = %d, want %d", got, tt.wantNRej)
	}
}

func TestNewGemini(t *testing.T) {
	if _, err := NewGemini(Config{}, "", nil, nil); err == nil || !strings.Contains(err.Error(), "GEMINI_API_KEY is not set") {
		t.Errorf("empty key: err = %v, want GEMINI_API_KEY is not set", err)
	}
	if _, err := NewGemini(Config{Timeout: -1}, testKey, nil, nil); err == nil || !strings.Contains(err.Error(), "ocr.timeout") {
		t.Errorf("bad config: err = %v, want ocr.timeout", err)
	}
	client := &http.Client{Timeout: time.Minute}
	g, err := NewGemini(Config{}, testKey, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.client == client || client.CheckRedirect != nil {
		t.Errorf("NewGemini changed the caller's client instead of a copy")
	}
	if g.client.Timeout != time.Minute {
		t.Errorf("client timeout = %v, want the caller's", g.client.Timeout)
	}

	for _, tt := range []struct{ base, model, want string }{
		{"https://generativelanguage.googleapis.com", "gemini-2.5-flash", "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"},
		{"http://proxy.local/gemini/", "models/gemini-2.5-flash-lite", "http://proxy.local/gemini/v1beta/models/gemini-2.5-flash-lite:generateContent"},
		{"http://x", "a b/c?d", "http://x/v1beta/models/a%20b%2Fc%3Fd:generateContent"},
	} {
		cfg := Config{BaseURL: tt.base, Model: tt.model, ModelOverrides: []ModelOverride{
			{Name: "a b/c?d", ImageTokens: "tiles", InputUSDPerMillion: 1, OutputUSDPerMillion: 1}}}
		g, err := NewGemini(cfg, testKey, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if g.primary.endpoint != tt.want {
			t.Errorf("endpoint(%q, %q) = %q, want %q", tt.base, tt.model, g.primary.endpoint, tt.want)
		}
	}
}

func TestSleepCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := sleepCtx(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("sleepCtx on a canceled ctx = %v, want context.Canceled", err)
	}
	if err := sleepCtx(t.Context(), time.Millisecond); err != nil {
		t.Errorf("sleepCtx = %v, want nil", err)
	}
}

// alwaysRetry lets Read make its one retry, as a caller with room in its
// budget does.
func alwaysRetry() bool { return true }

// The retry is a paid call: Read makes it only when the caller, asked
// first, has claimed it.
func TestGeminiReadRetryNeedsTheCallersClaim(t *testing.T) {
	for _, tt := range []struct {
		name      string
		mayRetry  func() bool
		wantCalls int32
	}{
		{"claimed", alwaysRetry, 2},
		{"refused", func() bool { return false }, 1},
		{"no gate", nil, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeGemini(t, DefaultMaxOutputTokens, reply{503, "err_503.json", ""}, reply{200, "ok.json", ""})
			g, slept, _ := newTestGemini(t, Config{}, fake.URL)
			asked := 0
			var gate func() bool
			if tt.mayRetry != nil {
				gate = func() bool { asked++; return tt.mayRetry() }
			}
			_, err := g.Read(t.Context(), testImage, gate)
			if got := fake.calls.Load(); got != tt.wantCalls {
				t.Errorf("calls = %d, want %d", got, tt.wantCalls)
			}
			if tt.mayRetry != nil && asked != 1 {
				t.Errorf("asked %d times before the retry, want once", asked)
			}
			if wantSleeps := int(tt.wantCalls) - 1; len(*slept) != wantSleeps {
				t.Errorf("slept %v, want %d sleeps", *slept, wantSleeps)
			}
			if tt.wantCalls == 1 {
				if ue := upstreamError(t, err); ue.Status != 503 {
					t.Errorf("error = %v, want the 503", err)
				}
			} else if err != nil {
				t.Errorf("Read after the retry: %v", err)
			}
		})
	}
}
