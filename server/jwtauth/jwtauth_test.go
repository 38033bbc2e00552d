package jwtauth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	testIssuer = "https://clerk.app.test"
	jwksPath   = "/.well-known/jwks.json"
)

// testJWK is the public half of a fresh Ed25519 key, as a JWK.
func testJWK(t *testing.T) map[string]any {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"kid": "ed-1", "use": "sig", "alg": "EdDSA", "kty": "OKP", "crv": "Ed25519",
		"x": base64.RawURLEncoding.EncodeToString(pub)}
}

// newJWKS serves a JWKS of one key at jwksPath on loopback.
func newJWKS(t *testing.T) *httptest.Server {
	t.Helper()
	body, err := json.Marshal(map[string]any{"keys": []any{testJWK(t)}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != jwksPath {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// lockedBuffer lets the verifier's background fetcher log while the test
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestJWTRedirectToPlainHTTPRefused: a JWKS URL that redirects to plain
// http on another host does not load keys from there.
func TestJWTRedirectToPlainHTTPRefused(t *testing.T) {
	f := newJWKS(t)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/local" {
			http.Redirect(w, r, f.URL+jwksPath, http.StatusFound) // loopback: allowed
			return
		}
		http.Redirect(w, r, "http://jwks.example.invalid"+jwksPath, http.StatusFound)
	}))
	defer redirect.Close()
	cases := []struct {
		path string
		keys int
	}{{"/local", 1}, {"/away", 0}}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			logs := &lockedBuffer{}
			cfg := Config{Issuer: testIssuer, RefreshInterval: time.Hour}
			cfg.JWKSURL = redirect.URL + c.path
			v, err := NewVerifier(t.Context(), cfg, func(string) bool { return true },
				Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			if got := v.KeyCount(); got != c.keys {
				t.Errorf("%d keys loaded, want %d", got, c.keys)
			}
			out := logs.String()
			if c.keys == 0 && !strings.Contains(out, "redirect") {
				t.Errorf("the refused redirect is not logged:\n%s", out)
			}
		})
	}
}

// TestJWTOversizedJWKSRefused: a key set padded past 1 MiB is not read to
// its end, so no keys load from it.
func TestJWTOversizedJWKSRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		pad  int
		keys int
	}{{"small", 1000, 1}, {"over 1 MiB", 1 << 20, 0}} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := json.Marshal(map[string]any{"keys": []any{testJWK(t)}})
				w.Write(bytes.Repeat([]byte(" "), c.pad)) // valid JSON whitespace
				w.Write(body)
			}))
			defer srv.Close()
			cfg := Config{JWKSURL: srv.URL + jwksPath, Issuer: testIssuer, RefreshInterval: time.Hour}
			v, err := NewVerifier(t.Context(), cfg, func(string) bool { return true }, Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			if got := v.KeyCount(); got != c.keys {
				t.Errorf("%d keys loaded, want %d", got, c.keys)
			}
		})
	}
}
