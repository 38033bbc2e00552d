package ocr

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A call goes to the model the caller names, with that model's request
// shape (a Gemini 2.5 fallback gets a thinking budget, not a level), and
// a model that is neither ocr.model
// nor ocr.fallback_model is refused without a call.
func TestGeminiReadModelFallback(t *testing.T) {
	ok, err := os.ReadFile(filepath.Join("testdata", "ok.json"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	bodies := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies[r.URL.Path] = string(b)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(ok)
	}))
	defer srv.Close()
	g, _, _ := newTestGemini(t, Config{FallbackModel: "gemini-2.5-flash-lite"}, srv.URL)

	for _, tt := range []struct{ model, path, thinking string }{
		{"", "/v1beta/models/" + DefaultModel + ":generateContent", `"thinkingLevel"`},
		{DefaultModel, "/v1beta/models/" + DefaultModel + ":generateContent", `"thinkingLevel"`},
		{"gemini-2.5-flash-lite", "/v1beta/models/gemini-2.5-flash-lite:generateContent", `"thinkingBudget":0`},
	} {
		if _, err := g.ReadModel(t.Context(), tt.model, testImage, nil); err != nil {
			t.Fatalf("ReadModel(%q): %v", tt.model, err)
		}
		mu.Lock()
		body, called := bodies[tt.path]
		mu.Unlock()
		if !called || !strings.Contains(body, tt.thinking) {
			t.Errorf("ReadModel(%q): no call to %s with %s (calls: %v)", tt.model, tt.path, tt.thinking, bodies)
		}
	}
	n := len(bodies)
	_, err = g.ReadModel(t.Context(), "gemini-2.5-pro", testImage, nil)
	if ue := upstreamError(t, err); !errors.Is(ue, ErrModelNotFound) {
		t.Errorf("a third model: %v, want ErrModelNotFound", err)
	}
	if len(bodies) != n {
		t.Error("a call went to a model that is neither configured one")
	}
}

func TestFallbackModelMustBeKnown(t *testing.T) {
	err := Config{FallbackModel: "gemini-9-nano"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "ocr.fallback_model") || !strings.Contains(err.Error(), "model_overrides") {
		t.Errorf("unknown fallback: %v, want an ocr.fallback_model error that names ocr.model_overrides", err)
	}
	if err := (Config{FallbackModel: "gemini-2.5-flash-lite"}).Validate(); err != nil {
		t.Errorf("known fallback: %v", err)
	}
	p, ok := Config{FallbackModel: "gemini-2.5-flash-lite"}.PriceOf("gemini-2.5-flash-lite")
	if !ok || p.InputUSDPerMillion != 0.10 || p.OutputUSDPerMillion != 0.40 {
		t.Errorf("the fallback's price: %+v %v, want its list price 0.10 / 0.40", p, ok)
	}
}

func TestSimulatedReadModel(t *testing.T) {
	s, err := NewSimulated(Config{Provider: ProviderSimulated, FallbackModel: "gemini-2.5-flash-lite"})
	if err != nil {
		t.Fatal(err)
	}
	img := Image{Data: []byte("x"), MIME: MIMEPNG, Width: 2000, Height: 2000}
	prim, err := s.ReadModel(t.Context(), "", img, nil)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := s.ReadModel(t.Context(), "gemini-2.5-flash-lite", img, nil)
	if err != nil {
		t.Fatal(err)
	}
	if prim.Model != DefaultModel || fb.Model != "gemini-2.5-flash-lite" || prim.Usage == fb.Usage {
		t.Errorf("primary %s %+v, fallback %s %+v: want each model named and counted by its own image rule", prim.Model, prim.Usage, fb.Model, fb.Usage)
	}
	if _, err := s.ReadModel(t.Context(), "gemini-2.5-pro", img, nil); err == nil {
		t.Error("a third model was read")
	}
}

// config check says which rule and prices the fallback's calls count at.
func TestRulesNameTheFallback(t *testing.T) {
	rules := strings.Join(Config{FallbackModel: "gemini-2.5-flash-lite"}.Rules(checkDay), "\n")
	if !strings.Contains(rules, "fallback model gemini-2.5-flash-lite") || !strings.Contains(rules, "$0.1 in / $0.4 out") {
		t.Errorf("Rules:\n%s\nwant the fallback's line with its prices", rules)
	}
	if rules := strings.Join(Config{}.Rules(checkDay), "\n"); strings.Contains(rules, "fallback") {
		t.Errorf("Rules without a fallback:\n%s", rules)
	}
}
