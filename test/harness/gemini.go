package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Gemini is a fake Gemini generateContent endpoint on 127.0.0.1 (or on
// the address NewGeminiAt is given) that counts every call it receives, by UTC day of arrival. It answers each
// well-formed call, after Latency, with the recorded reply in the
// module's ocr/testdata/ok.json.
type Gemini struct {
	URL     string
	Latency time.Duration

	srv   *http.Server
	ln    net.Listener
	reply []byte

	mu      sync.Mutex
	calls   map[string]int64 // UTC day -> calls
	byModel map[string]int64 // model -> calls in the wire format
	bad     int64            // calls not in the wire format
}

// Model is the model the fake serves; the server's ocr.model must be it.
const Model = "gemini-3.5-flash-lite"

// Fallback is the other model the fake serves, for ocr.fallback_model.
const Fallback = "gemini-2.5-flash-lite"

// NewGemini starts the fake on 127.0.0.1. root is the module root (for
// its recorded reply).
func NewGemini(root string, latency time.Duration) (*Gemini, error) {
	return NewGeminiAt(root, "127.0.0.1:0", latency)
}

// NewGeminiAt is NewGemini listening on addr (host:port), for a server in
// a network namespace of the test's own that reaches the fake over a veth.
func NewGeminiAt(root, addr string, latency time.Duration) (*Gemini, error) {
	reply, err := os.ReadFile(filepath.Join(root, "ocr", "testdata", "ok.json"))
	if err != nil {
		return nil, err
	}
	if !json.Valid(reply) {
		return nil, fmt.Errorf("ok.json is not JSON")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	g := &Gemini{URL: "http://" + ln.Addr().String(), Latency: latency, ln: ln, reply: reply, calls: map[string]int64{}, byModel: map[string]int64{}}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

func (g *Gemini) serve(w http.ResponseWriter, r *http.Request) {
	// A call is counted when it arrives, before anything can fail: it is
	// what the provider would bill.
	g.mu.Lock()
	g.calls[time.Now().UTC().Format("2006-01-02")]++
	g.mu.Unlock()

	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	var req struct {
		Contents []struct {
			Parts []struct {
				InlineData *struct {
					MIMEType string `json:"mimeType"`
					Data     string `json:"data"`
				} `json:"inlineData"`
			} `json:"parts"`
		} `json:"contents"`
	}
	if err != nil {
		return // the sender died during the upload: billed, never answered
	}
	path := r.URL.EscapedPath()
	model := ""
	for _, m := range []string{Model, Fallback} {
		if path == "/v1beta/models/"+m+":generateContent" {
			model = m
		}
	}
	ok := r.Method == http.MethodPost && model != "" &&
		r.Header.Get("x-goog-api-key") != "" && json.Unmarshal(body, &req) == nil &&
		len(req.Contents) > 0 && hasImage(req.Contents[0].Parts)
	if !ok {
		g.mu.Lock()
		g.bad++
		g.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"code":400,"message":"not the wire format","status":"INVALID_ARGUMENT"}}`))
		return
	}
	g.mu.Lock()
	g.byModel[model]++
	g.mu.Unlock()
	select {
	case <-time.After(g.Latency):
	case <-r.Context().Done():
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(g.reply)
}

func hasImage(parts []struct {
	InlineData *struct {
		MIMEType string `json:"mimeType"`
		Data     string `json:"data"`
	} `json:"inlineData"`
}) bool {
	for _, p := range parts {
		if p.InlineData != nil && p.InlineData.Data != "" {
			return true
		}
	}
	return false
}

// Calls returns the calls received so far, by UTC day, and the total.
func (g *Gemini) Calls() (byDay map[string]int64, total int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	byDay = make(map[string]int64, len(g.calls))
	for d, n := range g.calls {
		byDay[d] = n
		total += n
	}
	return byDay, total
}

// CallsTo returns how many calls in the wire format went to model.
func (g *Gemini) CallsTo(model string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byModel[model]
}

// Bad returns how many calls were not in the wire format (a call whose
// upload was cut off by a kill is not counted here).
func (g *Gemini) Bad() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.bad
}

// Close stops the fake.
func (g *Gemini) Close() error { return g.srv.Close() }
