package ocr

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// wire is what a request body says of media resolution and thinking, read
// by exact key (encoding/json would match a misspelt key case-blind).
type wire struct {
	partLevel     string // contents[0].parts[0].mediaResolution.level
	globalLevel   string // generationConfig.mediaResolution
	thinkingLevel string // generationConfig.thinkingConfig.thinkingLevel
	budget        int    // generationConfig.thinkingConfig.thinkingBudget
	hasBudget     bool
	hasPartLevel  bool
	hasGlobal     bool
	hasLevel      bool
}

func wireOf(t *testing.T, body []byte) wire {
	t.Helper()
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("request body is not JSON: %v", err)
	}
	obj := func(v any) map[string]any { m, _ := v.(map[string]any); return m }
	var w wire
	if contents, _ := req["contents"].([]any); len(contents) > 0 {
		if parts, _ := obj(contents[0])["parts"].([]any); len(parts) > 0 {
			if mr, ok := obj(parts[0])["mediaResolution"]; ok {
				w.hasPartLevel = true
				w.partLevel, _ = obj(mr)["level"].(string)
			}
		}
	}
	gc := obj(req["generationConfig"])
	if v, ok := gc["mediaResolution"]; ok {
		w.hasGlobal = true
		w.globalLevel, _ = v.(string)
	}
	tc := obj(gc["thinkingConfig"])
	if v, ok := tc["thinkingLevel"]; ok {
		w.hasLevel = true
		w.thinkingLevel, _ = v.(string)
	}
	if v, ok := tc["thinkingBudget"]; ok {
		w.hasBudget = true
		n, _ := v.(float64)
		w.budget = int(n)
	}
	return w
}

// TestGeminiRequestPerModel: the body a fake Gemini receives carries
// media_resolution and thinkingConfig as the REST API spells them, for
// each kind of model: Gemini 3 and later take mediaResolution (per part,
// and in generationConfig but for ultra_high) and a thinking level; Gemini
// 2.5 takes a thinking budget and no mediaResolution.
func TestGeminiRequestPerModel(t *testing.T) {
	override := ModelOverride{Name: "gemini-9-flash", ImageTokens: "media_resolution", InputUSDPerMillion: 1, OutputUSDPerMillion: 4}
	for _, tt := range []struct {
		name, model, level string
		want               wire
	}{
		{"3.5 flash-lite low", "gemini-3.5-flash-lite", MediaLow, wire{partLevel: "MEDIA_RESOLUTION_LOW", globalLevel: "MEDIA_RESOLUTION_LOW", thinkingLevel: "minimal", hasPartLevel: true, hasGlobal: true, hasLevel: true}},
		{"3.5 flash-lite medium", "gemini-3.5-flash-lite", MediaMedium, wire{partLevel: "MEDIA_RESOLUTION_MEDIUM", globalLevel: "MEDIA_RESOLUTION_MEDIUM", thinkingLevel: "minimal", hasPartLevel: true, hasGlobal: true, hasLevel: true}},
		{"3.5 flash-lite default", "gemini-3.5-flash-lite", "", wire{partLevel: "MEDIA_RESOLUTION_HIGH", globalLevel: "MEDIA_RESOLUTION_HIGH", thinkingLevel: "minimal", hasPartLevel: true, hasGlobal: true, hasLevel: true}},
		{"ultra high goes per part only", "gemini-3.8-flash", MediaUltraHigh, wire{partLevel: "MEDIA_RESOLUTION_ULTRA_HIGH", thinkingLevel: "minimal", hasPartLevel: true, hasLevel: true}},
		{"gemini 4 thinks low, by level only", "gemini-4-argon", MediaHigh, wire{partLevel: "MEDIA_RESOLUTION_HIGH", globalLevel: "MEDIA_RESOLUTION_HIGH", thinkingLevel: "low", hasPartLevel: true, hasGlobal: true, hasLevel: true}},
		{"3.1 pro thinks low", "gemini-3.1-pro-preview", MediaHigh, wire{partLevel: "MEDIA_RESOLUTION_HIGH", globalLevel: "MEDIA_RESOLUTION_HIGH", thinkingLevel: "low", hasPartLevel: true, hasGlobal: true, hasLevel: true}},
		{"override", "gemini-9-flash", MediaMedium, wire{partLevel: "MEDIA_RESOLUTION_MEDIUM", globalLevel: "MEDIA_RESOLUTION_MEDIUM", thinkingLevel: "low", hasPartLevel: true, hasGlobal: true, hasLevel: true}},
		{"2.5 flash thinks not", "gemini-2.5-flash", MediaHigh, wire{hasBudget: true}},
		{"2.5 pro thinks least", "gemini-2.5-pro", MediaHigh, wire{budget: 128, hasBudget: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var body []byte
			var path string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				body, path = b, r.URL.EscapedPath()
				mu.Unlock()
				reply, err := os.ReadFile(filepath.Join("testdata", "ok.json"))
				if err != nil {
					t.Error(err)
				}
				w.Header().Set("Content-Type", "application/json; charset=UTF-8")
				w.Write(reply)
			}))
			defer srv.Close()
			cfg := Config{Model: tt.model, MediaResolution: tt.level, ModelOverrides: []ModelOverride{override}}
			g, _, _ := newTestGemini(t, cfg, srv.URL)
			if _, err := g.Read(t.Context(), testImage, nil); err != nil {
				t.Fatalf("Read: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if got, want := path, "/v1beta/models/"+tt.model+":generateContent"; got != want {
				t.Errorf("path = %q, want %q", got, want)
			}
			if got := wireOf(t, body); got != tt.want {
				t.Errorf("wire = %+v, want %+v\nbody: %s", got, tt.want, body)
			}
		})
	}
}
