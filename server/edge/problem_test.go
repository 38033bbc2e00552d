package edge

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
)

// TestSharedHeaderValuesKept: answers of refusals with and without a
// Retry-After, and of a 401, share the problems' fixed header values
// (problem.go) and never write over them (server/api's
// TestRefusalAnswers checks the answers themselves).
func TestSharedHeaderValuesKept(t *testing.T) {
	e := newTestEdge(t, nil)
	ec := e.NewEcho(true)
	ec.GET("/busy", func(echo.Context) error { return ErrServerBusy.WithRetryAfter(7) })
	ec.GET("/401", func(echo.Context) error { return ErrUnauthorized })
	for range 3 {
		for _, path := range []string{"/busy", "/401"} {
			w := &headerRecorder{h: http.Header{}}
			r, err := http.NewRequest(http.MethodGet, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			ec.ServeHTTP(w, r)
		}
	}
	if n := problemContentType[0] + noStore[0] + bearerChallenge[0]; n != `application/problem+jsonno-storeBearer realm="breakwater"` {
		t.Errorf("a shared header value was written over: %q", n)
	}
}

// headerRecorder is a ResponseWriter that keeps only its headers.
type headerRecorder struct{ h http.Header }

func (w *headerRecorder) Header() http.Header         { return w.h }
func (w *headerRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (w *headerRecorder) WriteHeader(int)             {}
