package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"breakwater/test/harness"
)

// TestKillKeepsDegradedMode: soft at 5 calls, hard at 10, and the real
// server killed (SIGKILL) after the third read. The restarted server
// reads the day's calls from the ledger, so reads 4 and 5 still go to
// ocr.model, 6-10 to ocr.fallback_model, and the 11th is refused.
func TestKillKeepsDegradedMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir, bin, g := buildWithGemini(ctx, t)
	config := filepath.Join(dir, "config.toml")
	if err := harness.WriteConfig(config, harness.Config{DBPath: filepath.Join(dir, "bw.db"), GeminiURL: g.URL,
		DailyRequests: 10, Plan: "crash"}); err != nil {
		t.Fatal(err)
	}
	// The soft ceiling and the fallback, from the environment (any key
	// may be set so).
	env := []string{"GEMINI_API_KEY=k", "BREAKWATER_BUDGET__SOFT_DAILY_REQUESTS=5",
		"BREAKWATER_OCR__FALLBACK_MODEL=" + harness.Fallback}
	key, err := harness.CreateKey(ctx, bin, config, "degrade-user", "crash")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 15 * time.Second}
	var models []string
	serve := func(run string, from, to int) *harness.Process {
		t.Helper()
		proc, err := harness.Start(bin, config, filepath.Join(dir, run+".log"), env...)
		if err != nil {
			t.Fatal(err)
		}
		for i := from; i <= to; i++ {
			status, model := postModel(ctx, t, client, proc.Addr, key, distinctPNG(t, i))
			if status != http.StatusOK {
				proc.Kill()
				t.Fatalf("%s, read %d: %d", run, i, status)
			}
			models = append(models, model)
		}
		return proc
	}
	serve("killed", 1, 3).Kill()
	proc := serve("restarted", 4, 10)
	defer proc.Stop(20 * time.Second)
	if status, _ := postModel(ctx, t, client, proc.Addr, key, distinctPNG(t, 11)); status != http.StatusServiceUnavailable {
		t.Errorf("the 11th read: %d, want 503", status)
	}
	for i, m := range models {
		want := harness.Model
		if i >= 5 {
			want = harness.Fallback
		}
		if m != want {
			t.Errorf("read %d went to %q, want %q (all: %v)", i+1, m, want, models)
		}
	}
	if p, f := g.CallsTo(harness.Model), g.CallsTo(harness.Fallback); p != 5 || f != 5 {
		t.Errorf("upstream calls: %d to %s, %d to %s; want 5 and 5", p, harness.Model, f, harness.Fallback)
	}
}

// postModel sends img to addr's /v1/ocr with key and returns the status
// and the answer's "model".
func postModel(ctx context.Context, t *testing.T, client *http.Client, addr, key string, img []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Model string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body.Model
}

// distinctPNG is a small gray PNG that differs for each seed.
func distinctPNG(t *testing.T, seed int) []byte {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, 32, 16))
	for i := range img.Pix {
		img.Pix[i] = uint8(seed*7 + i)
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
