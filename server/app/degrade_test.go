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
	"strings"
	"sync"
	"testing"

	"breakwater/budget"
	"breakwater/ocr"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// modelGemini is a fake generateContent that answers for any model and
// counts the calls to each.
type modelGemini struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func newModelGemini(t *testing.T) *modelGemini {
	g := &modelGemini{calls: map[string]int{}}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		model, _ := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1beta/models/"), ":generateContent")
		g.mu.Lock()
		g.calls[model]++
		g.mu.Unlock()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":0,"totalTokenCount":322},"modelVersion":"`+model+`"}`)
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *modelGemini) count() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return map[string]int{"primary": g.calls["gemini-3.5-flash-lite"], "fallback": g.calls["gemini-2.5-flash-lite"]}
}

// degradeConfig is a config.toml with soft at soft calls and hard at hard.
func degradeConfig(storage, baseURL string, soft, hard int) string {
	return fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
%s
[ocr]
base_url = %q
dedupe_window = "0s"
fallback_model = "gemini-2.5-flash-lite"
[budget]
daily_requests = %d
soft_daily_requests = %d
[limits.user]
rate = 100000
burst = 100
[plans.free]
monthly_quota = 100
`, storage, baseURL, hard, soft)
}

// The whole wiring, on both backends: soft at 5 calls, hard at 10, calls
// 1-5 read with ocr.model, 6-10 with ocr.fallback_model, the 11th refused,
// across a restart after the third (bolt: the file reopened; PostgreSQL:
// a second instance on the same database, which starts from the shared
// ledger); then a reload that raises the soft ceiling returns to ocr.model.
func TestDegradeWiring(t *testing.T) {
	for _, backend := range []string{"bolt", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			gemini := newModelGemini(t)
			vars := map[string]string{"GEMINI_API_KEY": "test-key",
				"BREAKWATER_SECRET": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}
			storage := fmt.Sprintf("[storage]\npath = %q", filepath.Join(t.TempDir(), "bw.db"))
			if backend == "postgres" {
				vars[postgres.EnvURL] = pgtest.NewDatabase(t)
				storage = "[storage]\nbackend = \"postgres\""
			}
			getenv := env(vars)
			load := func(soft, hard int) Config {
				cfg, err := Load(writeConfig(t, degradeConfig(storage, gemini.URL, soft, hard)), getenv)
				if err != nil {
					t.Fatal(err)
				}
				return cfg
			}
			cfg := load(5, 10)
			open := func() *App {
				a, err := Open(context.Background(), cfg, Options{Getenv: getenv, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Close)
				return a
			}
			a := open()
			key, _, err := a.Keys().Create("ann", "free")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			var lastBody []byte
			read := func(a *App, i int) int {
				res := postOCR(t, a, key, fmt.Sprintf("k-%d", i), grayPNG(t, uint8(i)))
				lastBody = res.body
				var body struct{ Model string }
				json.Unmarshal(res.body, &body)
				if res.status == http.StatusOK {
					got = append(got, body.Model)
				}
				return res.status
			}
			mustRead := func(a *App, i int) {
				t.Helper()
				if status := read(a, i); status != http.StatusOK {
					t.Errorf("read %d: %d %s, want 200", i, status, lastBody)
				}
			}
			for i := 1; i <= 3; i++ {
				mustRead(a, i)
			}
			if backend == "bolt" {
				a.Close()
			}
			a = open()
			for i := 4; i <= 10; i++ {
				mustRead(a, i)
			}
			if status := read(a, 11); status != http.StatusServiceUnavailable {
				t.Errorf("the 11th read: %d, want 503", status)
			}
			want := "[" + strings.Repeat("gemini-3.5-flash-lite ", 5) + strings.TrimSpace(strings.Repeat("gemini-2.5-flash-lite ", 5)) + "]"
			if fmt.Sprint(got) != want {
				t.Errorf("models:\n got %v\nwant %s", got, want)
			}
			if c := gemini.count(); c["primary"] != 5 || c["fallback"] != 5 {
				t.Errorf("upstream calls %v, want 5 and 5", c)
			}
			// The usage rows name the model, and the day counts each
			// call at its model's price.
			b, err := a.operator.Budget(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			usage := ocr.Usage{PromptTokens: 298, CandidatesTokens: 24}
			primary, _ := cfg.OCR.PriceOf("gemini-3.5-flash-lite")
			fallback, _ := cfg.OCR.PriceOf("gemini-2.5-flash-lite")
			spend := 5*primary.Cost(usage) + 5*fallback.Cost(usage)
			if b.ReadsByModel["gemini-3.5-flash-lite"] != 5 || b.ReadsByModel["gemini-2.5-flash-lite"] != 5 ||
				b.DegradedBy != "soft_daily_requests" || budget.MicroUSD(b.SpendUSD+0.0000005) != spend {
				t.Errorf("budget: %+v, want 5 reads per model and %d micro-dollars", b, spend)
			}
			if err := a.Reload(load(15, 20), "test"); err != nil {
				t.Fatal(err)
			}
			read(a, 12)
			if last := got[len(got)-1]; len(got) != 11 || last != "gemini-3.5-flash-lite" {
				t.Errorf("after the reload that raised the soft ceiling: %v, want a read with the primary model", got)
			}
		})
	}
}

// The config errors of degrade mode name the key and what to set.
func TestDegradeConfigErrors(t *testing.T) {
	for _, tt := range []struct{ body, want string }{
		{"[budget]\nsoft_daily_usd = 2\n" + minimal, "ocr.fallback_model: required when a soft ceiling"},
		{"[budget]\ndaily_requests = 10\nsoft_daily_requests = 10\n[ocr]\nfallback_model = \"gemini-2.5-flash-lite\"\n" + minimal,
			"budget.soft_daily_requests: must be below budget.daily_requests"},
		{"[ocr]\nfallback_model = \"gemini-9-nano\"\n" + minimal, "ocr.fallback_model: \"gemini-9-nano\" is not a model"},
		{"[ocr]\nfallback_model = \"gemini-3.5-flash-lite\"\n" + minimal, "ocr.fallback_model: must differ from ocr.model"},
		{"[plans.free]\nmonthly_quota = 10\nmodel = \"fallback\"\n", "plans.free.model: \"fallback\" needs ocr.fallback_model"},
		{"[plans.free]\nmonthly_quota = 10\nmodel = \"cheapest\"\n", "plans.free.model: must be"},
	} {
		_, err := Load(writeConfig(t, tt.body), env(map[string]string{"GEMINI_API_KEY": "k"}))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.body, err, tt.want)
		}
	}
	if _, err := Load(writeConfig(t, "[budget]\nsoft_daily_usd = 2\n[ocr]\nfallback_model = \"gemini-2.5-flash-lite\"\n"+minimal),
		env(map[string]string{"GEMINI_API_KEY": "k"})); err != nil {
		t.Errorf("a valid soft ceiling: %v", err)
	}
}
