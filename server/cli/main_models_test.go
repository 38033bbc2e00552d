package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"breakwater/ocr"
	"breakwater/server/operator"
)

// TestConfigCheckUnknownModel: a model whose image tokens and price the
// table does not know stops config check with what to set;
// allow_unknown_model, which switched the check off, is refused and names
// what replaces it; config check says which rule and prices apply.
func TestConfigCheckUnknownModel(t *testing.T) {
	var out, errOut bytes.Buffer
	env := envFrom(map[string]string{"GEMINI_API_KEY": "test-key"})
	path := writeConfig(t, minimalConfig+"\n[ocr]\nmodel = \"gemini-3.7-flash\"\n")
	err := run(context.Background(), []string{"config", "check", "--config", path}, env, &out, &errOut)
	if err == nil {
		t.Fatal("config check with an unknown model: nil, want it refused")
	}
	for _, want := range []string{`ocr.model: "gemini-3.7-flash" is not a model`, "[[ocr.model_overrides]]", `name = "gemini-3.7-flash"`,
		`image_tokens = "media_resolution"`, "input_usd_per_million", "output_usd_per_million"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("config check: %v\nwant it to say %q", err, want)
		}
	}

	path = writeConfig(t, minimalConfig+"\n[ocr]\nmodel = \"gemini-3.7-flash\"\nallow_unknown_model = true\n")
	err = run(context.Background(), []string{"config", "check", "--config", path}, env, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "ocr.allow_unknown_model: is no longer read") || !strings.Contains(err.Error(), "[[ocr.model_overrides]]") {
		t.Errorf("config check with allow_unknown_model: %v, want it refused, naming ocr.model_overrides", err)
	}

	// The default config says which rule, prices and thinking apply.
	out.Reset()
	path = writeConfig(t, minimalConfig)
	if err := run(context.Background(), []string{"config", "check", "--config", path}, env, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ocr: model gemini-3.5-flash-lite (from the model table checked " + ocr.ModelsChecked + ";", "ocr: price of gemini-3.5-flash-lite on ",
		"at most 1120 per image", "charged at $0.3 in / $2.5 out", `thinkingLevel "minimal"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config check printed %q\nwant it to say %q", out.String(), want)
		}
	}

	out.Reset()
	path = writeConfig(t, minimalConfig+"\n[ocr]\nmodel = \"gemini-2.5-pro\"\n[ocr.price]\ninput_usd_per_million = 0.3\n")
	if err := run(context.Background(), []string{"config", "check", "--config", path}, env, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"warning: ocr.price.input_usd_per_million = 0.3 is below the list price of gemini-2.5-pro",
		"768-px tiles", "thinkingBudget 128"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config check printed %q\nwant it to say %q", out.String(), want)
		}
	}
}

// overrideGemini is a fake Gemini serving one model in the real wire
// format: each reply reports 600 prompt, 20 answer and 10 thinking tokens.
// It counts the calls and keeps the last request body.
func overrideGemini(t *testing.T, model string) (*httptest.Server, func() (int, []byte)) {
	t.Helper()
	var mu sync.Mutex
	var calls int
	var last []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls++
		last = body
		mu.Unlock()
		if r.URL.Path != "/v1beta/models/"+model+":generateContent" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":404,"message":"model not found","status":"NOT_FOUND"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":600,"candidatesTokenCount":20,"thoughtsTokenCount":10,"totalTokenCount":630},"modelVersion":"`+model+`"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, func() (int, []byte) {
		mu.Lock()
		defer mu.Unlock()
		return calls, last
	}
}

// TestModelOverrideEndToEnd: a model the table does not know, given with
// its rule and prices in ocr.model_overrides, is served; each read is
// reserved at the override's worst case and settled at its prices.
func TestModelOverrideEndToEnd(t *testing.T) {
	const model = "gemini-3.7-flash"
	gemini, calls := overrideGemini(t, model)
	dir := t.TempDir()
	// At $2 in / $10 out and media_resolution "medium" (560 tokens):
	// worst case (560+300)×2 + 256×10 = 4280 µ$; a read billed 600 in and
	// 30 out costs 600×2 + 30×10 = 1500 µ$. The day's ceiling is 1.5 worst
	// cases, 6420 µ$: read 1 (0 + 4280) and read 2 (1500 + 4280) fit, read
	// 3 (3000 + 4280) does not. Reserved at the default model's worst case
	// (1066 µ$) read 3 would fit; settled at the worst case, read 2 would
	// not.
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[storage]
path = %q
[ocr]
model = %q
base_url = %q
media_resolution = "medium"
dedupe_window = "0s"
[[ocr.model_overrides]]
name = %q
image_tokens = "media_resolution"
input_usd_per_million = 2.0
output_usd_per_million = 10.0
[budget]
daily_usd = 0.00642
[limits.user]
burst = 100
[plans.free]
monthly_quota = 100
`, filepath.Join(dir, "bw.db"), model, gemini.URL, model))
	env := envFrom(map[string]string{"GEMINI_API_KEY": "test-key"})
	key := createKey(t, path, "ann")
	addr, stop := startServe(t, path, env)
	img := samplePNG(t)
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusServiceUnavailable} {
		status, body, err := postImage(addr, key, img)
		if err != nil {
			t.Fatal(err)
		}
		if status != want || (status != http.StatusOK && !strings.Contains(body, "budget")) {
			t.Errorf("read %d: %d %s, want %d (the third refused by the budget)", i+1, status, body, want)
		}
	}
	n, last := calls()
	if n != 2 {
		t.Errorf("upstream calls = %d, want 2 (the third refused before the call)", n)
	}
	if !bytes.Contains(last, []byte(`"mediaResolution":{"level":"MEDIA_RESOLUTION_MEDIUM"}`)) || !bytes.Contains(last, []byte(`"thinkingLevel":"low"`)) {
		t.Errorf("request body %s, want the part's mediaResolution and the override's thinking level", last)
	}
	stop()

	var out bytes.Buffer
	if err := run(context.Background(), []string{"budget", "--json", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var b operator.BudgetInfo
	if err := json.Unmarshal(out.Bytes(), &b); err != nil {
		t.Fatalf("budget --json: %v: %s", err, out.String())
	}
	if got, want := b.SpendUSD, 0.003; math.Abs(got-want) > 1e-9 {
		t.Errorf("spend today = $%v, want $%v: two reads settled at the override's prices", got, want)
	}
}
