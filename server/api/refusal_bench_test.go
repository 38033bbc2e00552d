package api

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/server/keys"
)

// BenchmarkRefusal is the cost of one refusal through the real public
// handler, without sockets: a 429 to a key over its rate and a 401 to a
// random well-formed key, with their allocations, beside bare Echo's
// answer to the same request. The request and the
// response writer are reused, so what is counted is the server's work.
//
//	go test -run '^$' -bench Refusal -benchmem ./server/api/
func BenchmarkRefusal(b *testing.B) {
	img := pngBytes(b, 64, 32)
	b.Run("bare", func(b *testing.B) { // the reference: bare Echo's 200
		h := bareEcho()
		w := &discardWriter{h: http.Header{}}
		req, body := refusalRequest(img)
		serveEach(b, h, w, req, body, img, http.StatusOK, nil)
	})
	b.Run("429", func(b *testing.B) {
		srv, secrets := newBenchService(b, limiter.Config{Rate: 1, Window: time.Hour})
		h := srv.Handler()
		w := &discardWriter{h: http.Header{}}
		req, body := refusalRequest(img)
		auth := []string{"Bearer " + secrets[0]}
		req.Header["Authorization"] = auth
		h.ServeHTTP(w, req) // the one request the limit allows
		if w.status != http.StatusOK {
			b.Fatalf("first request: status %d, want 200", w.status)
		}
		serveEach(b, h, w, req, body, img, http.StatusTooManyRequests, nil)
	})
	b.Run("401", func(b *testing.B) {
		srv, _ := newBenchService(b, limiter.Config{Rate: 1, Window: time.Hour})
		h := srv.Handler()
		w := &discardWriter{h: http.Header{}}
		req, body := refusalRequest(img)
		auths := make([][]string, 1024) // made beforehand: a fresh key's cost is the client's
		for i := range auths {
			auths[i] = []string{"Bearer bw_" + keys.RandomString(32, keys.Base62)}
		}
		i := 0
		serveEach(b, h, w, req, body, img, http.StatusUnauthorized, func() {
			i++
			req.Header["Authorization"] = auths[i%len(auths)]
		})
	})
}

// serveEach sends req (its body reset to img) through h once per
// iteration, reporting allocations, and fails on any status but want;
// before, if set, runs ahead of each request.
func serveEach(b *testing.B, h http.Handler, w *discardWriter, req *http.Request, body *bytes.Reader, img []byte, want int, before func()) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		if before != nil {
			before()
		}
		w.reset()
		body.Reset(img)
		h.ServeHTTP(w, req)
		if w.status != want {
			b.Fatalf("status %d, want %d", w.status, want)
		}
	}
}

// refusalRequest is a reusable POST /v1/ocr of img; reset its body with
// the reader returned before each use.
func refusalRequest(img []byte) (*http.Request, *bytes.Reader) {
	body := bytes.NewReader(img)
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1/ocr", body)
	req.Header.Set("Content-Type", "image/png")
	req.ContentLength = int64(len(img))
	req.RemoteAddr = "127.0.0.1:40000"
	return req, body
}

// discardWriter is an http.ResponseWriter that keeps the status and
// forgets the body, and whose header map is reused.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) reset()                      { clear(w.h); w.status = 0 }
