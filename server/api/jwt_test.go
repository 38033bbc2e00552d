package api

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	dto "github.com/prometheus/client_model/go"

	"breakwater/server/edge"
	"breakwater/server/edgetest"
	"breakwater/server/jwtauth"
	"breakwater/server/keys"
)

const (
	testIssuer   = "https://clerk.app.test"
	testAudience = "breakwater-api"
	testOrigin   = "https://app.test"
	jwksPath     = "/.well-known/jwks.json"
)

// signingKey is a key pair made in the test, published (or not) in the
// fake JWKS under kid.
type signingKey struct {
	kid    string
	method jwt.SigningMethod
	priv   crypto.Signer
}

var (
	keysOnce sync.Once
	rsaPriv  *rsa.PrivateKey
	rsaPriv2 *rsa.PrivateKey
	ecPriv   *ecdsa.PrivateKey
	edPriv   ed25519.PrivateKey
)

// testKeys generates the RSA, EC and Ed25519 keys once per test binary:
// RSA generation is slow under -race.
func testKeys(t testing.TB) {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		if rsaPriv, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if rsaPriv2, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if ecPriv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		if _, edPriv, err = ed25519.GenerateKey(rand.Reader); err != nil {
			panic(err)
		}
	})
}

func rsaKey(t testing.TB, kid string) signingKey {
	testKeys(t)
	return signingKey{kid: kid, method: jwt.SigningMethodRS256, priv: rsaPriv}
}

func rsaKey2(t testing.TB, kid string) signingKey {
	testKeys(t)
	return signingKey{kid: kid, method: jwt.SigningMethodRS256, priv: rsaPriv2}
}

func ecKey(t testing.TB, kid string) signingKey {
	testKeys(t)
	return signingKey{kid: kid, method: jwt.SigningMethodES256, priv: ecPriv}
}

func edKey(t testing.TB, kid string) signingKey {
	testKeys(t)
	return signingKey{kid: kid, method: jwt.SigningMethodEdDSA, priv: edPriv}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwk is k's public half as a JWK, written by hand from RFC 7518.
func (k signingKey) jwk() map[string]any {
	m := map[string]any{"kid": k.kid, "use": "sig", "alg": k.method.Alg()}
	switch pub := k.priv.Public().(type) {
	case *rsa.PublicKey:
		m["kty"], m["n"], m["e"] = "RSA", b64(pub.N.Bytes()), b64(big.NewInt(int64(pub.E)).Bytes())
	case *ecdsa.PublicKey:
		raw, _ := pub.ECDH()
		xy := raw.Bytes()[1:] // 0x04 || X || Y, 32 bytes each
		m["kty"], m["crv"], m["x"], m["y"] = "EC", "P-256", b64(xy[:32]), b64(xy[32:])
	case ed25519.PublicKey:
		m["kty"], m["crv"], m["x"] = "OKP", "Ed25519", b64(pub)
	}
	return m
}

// sign makes a token with claims, signed by k, with k's kid.
func (k signingKey) sign(t testing.TB, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(k.method, claims)
	if k.kid != "" {
		tok.Header["kid"] = k.kid
	}
	s, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeJWKS is a provider's JWKS endpoint on loopback that counts its
// requests and can be taken down.
type fakeJWKS struct {
	*httptest.Server
	requests atomic.Int64
	down     atomic.Bool
	mu       sync.Mutex
	keys     []signingKey
}

func newFakeJWKS(t testing.TB, keys ...signingKey) *fakeJWKS {
	t.Helper()
	f := &fakeJWKS{keys: keys}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		if f.down.Load() || r.URL.Path != jwksPath {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		f.mu.Lock()
		set := []any{}
		for _, k := range f.keys {
			set = append(set, k.jwk())
		}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": set})
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeJWKS) publish(keys ...signingKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = keys
}

func (f *fakeJWKS) config() jwtauth.Config {
	return jwtauth.Config{
		JWKSURL: f.URL + jwksPath, Issuer: testIssuer, Audience: testAudience,
		AuthorizedParties: []string{testOrigin}, PlanClaim: "plan",
		// Long enough that the background refresh never runs during a
		// test; the unknown-kid limit is stepped with the test clock.
		RefreshInterval: time.Hour,
	}
}

// jwtStart is a mid-month time, so that stepping the clock by hours never
// starts a new quota month.
var jwtStart = time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)

// claimsAt are good claims for a token used at now.
func claimsAt(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss": testIssuer, "aud": testAudience, "azp": testOrigin, "sub": "user_2abc",
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Minute).Unix(),
	}
}

// with returns a copy of c with changes; a nil value removes the claim.
func with(c jwt.MapClaims, changes jwt.MapClaims) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for k, v := range changes {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = v
	}
	return out
}

// jwtRefusals reads breakwater_jwt_refusals_total{reason}.
func (e *env) jwtRefusals(reason string) float64 {
	e.t.Helper()
	var m dto.Metric
	if err := e.metrics.jwt.WithLabelValues(reason).Write(&m); err != nil {
		e.t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// unauthorizedBody is the API-key 401 body every JWT refusal must match.
func (e *env) unauthorizedBody() []byte {
	e.t.Helper()
	resp, data := e.post("bw_"+strings.Repeat("Z", 32), "image/png", pngBytes(e.t, 8, 8))
	edgetest.DecodeProblem(e.t, resp, data, http.StatusUnauthorized, "unauthorized")
	return data
}

// expect401 posts with token and checks the answer is the one 401 body.
func (e *env) expect401(token string, want []byte) {
	e.t.Helper()
	resp, data := e.post(token, "image/png", pngBytes(e.t, 8, 8))
	edgetest.DecodeProblem(e.t, resp, data, http.StatusUnauthorized, "unauthorized")
	if !bytes.Equal(data, want) {
		e.t.Errorf("401 body %s differs from the API-key 401 %s", data, want)
	}
}

func newJWTEnv(t *testing.T, keys ...signingKey) (*env, *fakeJWKS, *clock) {
	t.Helper()
	f := newFakeJWKS(t, keys...)
	clk := newClock(jwtStart)
	e := newEnv(t, envOptions{clock: clk.now, jwt: f.config(), plans: map[string]int64{"pro": 1000}})
	return e, f, clk
}

func TestJWTValidTokens(t *testing.T) {
	rs, es, ed := rsaKey(t, "rsa-1"), ecKey(t, "ec-1"), edKey(t, "ed-1")
	e, f, clk := newJWTEnv(t, rs, es, ed)
	img := pngBytes(t, 16, 16)
	cases := []struct {
		name  string
		key   signingKey
		claim jwt.MapClaims
		user  string
		limit int64
	}{
		{"RS256", rs, nil, "jwt:user_2abc", 100},
		{"ES256", es, jwt.MapClaims{"sub": "auth0|5f7c"}, "jwt:auth0|5f7c", 100},
		{"EdDSA", ed, jwt.MapClaims{"sub": "0b9f3c1e-supabase"}, "jwt:0b9f3c1e-supabase", 100},
		{"plan claim", rs, jwt.MapClaims{"sub": "paying", "plan": "pro"}, "jwt:paying", 1000},
		{"unknown plan falls back", rs, jwt.MapClaims{"sub": "odd", "plan": "platinum"}, "jwt:odd", 100},
		{"plan not a string", rs, jwt.MapClaims{"sub": "odd2", "plan": 7}, "jwt:odd2", 100},
		{"audience in a list", rs, jwt.MapClaims{"sub": "many", "aud": []string{"other", testAudience}}, "jwt:many", 100},
		{"within leeway", rs, jwt.MapClaims{"sub": "skew", "exp": jwtStart.Add(-2 * time.Second).Unix(), "nbf": jwtStart.Add(3 * time.Second).Unix()}, "jwt:skew", 100},
		{"sub in NFD", rs, jwt.MapClaims{"sub": "cafe\u0301"}, "jwt:caf\u00e9", 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			token := c.key.sign(t, with(claimsAt(clk.now()), c.claim))
			resp, data := e.post(token, "image/png", img)
			b := decodeOK(t, resp, data)
			if got, want := b.Quota.Limit, c.limit; got != want {
				t.Errorf("quota limit %d, want %d (plan)", got, want)
			}
			if got := e.quotas.Used(c.user, clk.now()); got != 1 {
				t.Errorf("user %q used %d, want 1", c.user, got)
			}
		})
	}
	// API keys keep working next to JWTs.
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	rows, err := e.db.Usage(jwtStart.Add(-time.Hour), jwtStart.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(cases)+1 || rows[0].UserID != "jwt:user_2abc" || rows[0].KeyID != jwtauth.KeyID {
		t.Errorf("usage rows %+v", rows)
	}
	if got := f.requests.Load(); got != 1 {
		t.Errorf("JWKS fetched %d times, want 1 (at start)", got)
	}
	// The statistics events carry the plan from the token, which gives
	// JWT users a daily line in the grey-zone detector.
	e.events.Close(context.Background())
	events, err := e.db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	plans := map[string]string{}
	for _, ev := range events {
		plans[ev.UserID] = ev.Plan
	}
	if plans["jwt:paying"] != "pro" || plans["jwt:user_2abc"] != keys.DefaultPlan {
		t.Errorf("event plans %v, want jwt:paying on pro and jwt:user_2abc on %s", plans, keys.DefaultPlan)
	}
}

func TestJWTRefusals(t *testing.T) {
	rs, es := rsaKey(t, "rsa-1"), ecKey(t, "ec-1")
	e, f, clk := newJWTEnv(t, rs, es)
	want := e.unauthorizedBody()
	now := clk.now()
	good := claimsAt(now)

	none := jwt.NewWithClaims(jwt.SigningMethodNone, good)
	none.Header["kid"] = rs.kid
	noneToken, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	// The classic confusion: HS256 with the RSA public key as the secret.
	pubDER, _ := x509.MarshalPKIXPublicKey(rsaPriv.Public())
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, good)
	hs.Header["kid"] = rs.kid
	hsToken, err := hs.SignedString(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	hsDER, err := hs.SignedString(pubDER)
	if err != nil {
		t.Fatal(err)
	}
	valid := rs.sign(t, good)
	parts := strings.Split(valid, ".")
	tampered := parts[0] + "." + b64([]byte(`{"sub":"admin","iss":"`+testIssuer+`"}`)) + "." + parts[2]
	huge := "eyJ" + strings.Repeat("a", 1<<19) + "." + strings.Repeat("b", 1<<19) + ".c"

	cases := []struct {
		name   string
		token  string
		reason string // "" when the token never reaches the verifier
	}{
		{"alg none", noneToken, "algorithm"},
		{"HS256 with the RSA public key (PEM)", hsToken, "algorithm"},
		{"HS256 with the RSA public key (DER)", hsDER, "algorithm"},
		{"RS384", signingKey{kid: rs.kid, method: jwt.SigningMethodRS384, priv: rsaPriv}.sign(t, good), "algorithm"},
		{"PS256", signingKey{kid: rs.kid, method: jwt.SigningMethodPS256, priv: rsaPriv}.sign(t, good), "algorithm"},
		{"RS256 token, EC key's kid", signingKey{kid: es.kid, method: jwt.SigningMethodRS256, priv: rsaPriv}.sign(t, good), "key_mismatch"},
		{"ES256 token, RSA key's kid", signingKey{kid: rs.kid, method: jwt.SigningMethodES256, priv: ecPriv}.sign(t, good), "key_mismatch"},
		{"signed by another key under a known kid", rsaKey2(t, rs.kid).sign(t, good), "signature"},
		{"tampered payload", tampered, "signature"},
		{"no kid", rsaKey(t, "").sign(t, good), "no_kid"},
		{"unknown kid", rsaKey2(t, "ghost").sign(t, good), "unknown_kid"},
		{"expired", rs.sign(t, with(good, jwt.MapClaims{"exp": now.Add(-time.Minute).Unix()})), "expired"},
		{"nbf in the future", rs.sign(t, with(good, jwt.MapClaims{"nbf": now.Add(time.Minute).Unix()})), "not_yet_valid"},
		{"iat in the future", rs.sign(t, with(good, jwt.MapClaims{"iat": now.Add(time.Minute).Unix()})), "not_yet_valid"},
		{"wrong iss", rs.sign(t, with(good, jwt.MapClaims{"iss": "https://evil.test"})), "issuer"},
		{"missing iss", rs.sign(t, with(good, jwt.MapClaims{"iss": nil})), "issuer"},
		{"wrong aud", rs.sign(t, with(good, jwt.MapClaims{"aud": "someone-else"})), "audience"},
		{"missing aud", rs.sign(t, with(good, jwt.MapClaims{"aud": nil})), "audience"},
		{"wrong azp", rs.sign(t, with(good, jwt.MapClaims{"azp": "https://evil.test"})), "azp"},
		{"missing azp", rs.sign(t, with(good, jwt.MapClaims{"azp": nil})), "azp"},
		{"missing exp", rs.sign(t, with(good, jwt.MapClaims{"exp": nil})), "missing_exp"},
		{"missing sub", rs.sign(t, with(good, jwt.MapClaims{"sub": nil})), "subject"},
		{"empty sub", rs.sign(t, with(good, jwt.MapClaims{"sub": ""})), "subject"},
		{"sub with a control character", rs.sign(t, with(good, jwt.MapClaims{"sub": "bob\x00"})), "subject"},
		{"sub too long", rs.sign(t, with(good, jwt.MapClaims{"sub": strings.Repeat("u", 129)})), "subject"},
		{"sub with a zero-width space", rs.sign(t, with(good, jwt.MapClaims{"sub": "bob\u200b"})), "subject"},
		{"sub with a bidi override", rs.sign(t, with(good, jwt.MapClaims{"sub": "\u202ebob"})), "subject"},
		{"sub not a string", rs.sign(t, with(good, jwt.MapClaims{"sub": 42})), "subject"},
		{"header not JSON", "bm90LWpzb24." + parts[1] + "." + parts[2], "malformed"},
		{"padded base64", parts[0] + "=." + parts[1] + "." + parts[2], ""},
		{"two segments", parts[0] + "." + parts[1], ""},
		{"four segments", valid + ".xyz", ""},
		{"empty header segment", "." + parts[1] + "." + parts[2], ""},
		{"a megabyte-long token", huge, "too_long"},
		{"a megabyte of letters", strings.Repeat("a", 1<<20), "too_long"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := e.jwtRefusals(c.reason)
			e.expect401(c.token, want)
			if c.reason != "" {
				if got := e.jwtRefusals(c.reason) - before; got != 1 {
					t.Errorf("breakwater_jwt_refusals_total{reason=%q} rose by %v, want 1", c.reason, got)
				}
			}
		})
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("upstream calls %d, want 0", got)
	}
	// Only the unknown kid caused a fetch, besides the one at start.
	if got := f.requests.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times, want 2", got)
	}
	resp, data := e.post(valid, "image/png", pngBytes(t, 8, 8))
	decodeOK(t, resp, data)
}

// TestJWTOff: without jwks_url a JWT is just a wrong API key.
func TestJWTOff(t *testing.T) {
	e := newEnv(t, envOptions{})
	want := e.unauthorizedBody()
	e.expect401(rsaKey(t, "rsa-1").sign(t, claimsAt(time.Now())), want)
	resp, data := e.post(e.key, "image/png", pngBytes(t, 8, 8))
	decodeOK(t, resp, data)
}

func TestJWTKeyRotation(t *testing.T) {
	oldKey, newKey := rsaKey(t, "2026-10"), ecKey(t, "2026-11")
	e, f, clk := newJWTEnv(t, oldKey)
	want := e.unauthorizedBody()
	img := pngBytes(t, 8, 8)
	resp, data := e.post(oldKey.sign(t, claimsAt(clk.now())), "image/png", img)
	decodeOK(t, resp, data)

	// The provider rotates: the old kid is gone, a new one is signing.
	f.publish(newKey)
	resp, data = e.post(newKey.sign(t, claimsAt(clk.now())), "image/png", img)
	decodeOK(t, resp, data)
	if got := f.requests.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times, want 2 (start, new kid)", got)
	}
	// The refetch dropped the old key: its tokens are refused, without
	// another fetch inside the interval.
	e.expect401(oldKey.sign(t, claimsAt(clk.now())), want)
	if got := e.jwtRefusals("unknown_kid"); got != 1 {
		t.Errorf("unknown_kid refusals %v, want 1", got)
	}
	if got := f.requests.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times, want still 2", got)
	}
}

func TestJWTJWKSDownAfterFirstFetch(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	e, f, clk := newJWTEnv(t, rs)
	want := e.unauthorizedBody()
	img := pngBytes(t, 8, 8)
	f.down.Store(true)
	// An unknown kid makes the verifier try the endpoint; it fails.
	e.expect401(rsaKey2(t, "ghost").sign(t, claimsAt(clk.now())), want)
	if got := f.requests.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times, want 2", got)
	}
	// The failed fetch did not drop the cached key.
	for range 3 {
		resp, data := e.post(rs.sign(t, claimsAt(clk.now())), "image/png", img)
		decodeOK(t, resp, data)
		clk.add(2 * time.Hour) // past the interval: nothing fetches for known kids
	}
	if got := f.requests.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times, want still 2: known kids need no fetch", got)
	}
	if !strings.Contains(e.logs.String(), "JWKS fetch failed") {
		t.Errorf("the failed fetch is not logged:\n%s", e.logs.String())
	}
}

func TestJWTJWKSDownAtStart(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	f := newFakeJWKS(t, rs)
	f.down.Store(true)
	clk := newClock(jwtStart)
	e := newEnv(t, envOptions{clock: clk.now, jwt: f.config()})
	want := e.unauthorizedBody()
	img := pngBytes(t, 8, 8)
	if !strings.Contains(e.logs.String(), "no JWKS keys yet") {
		t.Errorf("start without keys is not logged:\n%s", e.logs.String())
	}
	// The server runs: API keys work, JWTs are refused.
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	e.expect401(rs.sign(t, claimsAt(clk.now())), want)
	if got := e.jwtRefusals("no_keys"); got != 1 {
		t.Errorf("no_keys refusals %v, want 1", got)
	}
	// The endpoint comes back; within the interval nothing fetches yet.
	f.down.Store(false)
	e.expect401(rs.sign(t, claimsAt(clk.now())), want)
	if got := f.requests.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times, want 2 (start, first token)", got)
	}
	clk.add(time.Hour)
	resp, data = e.post(rs.sign(t, claimsAt(clk.now())), "image/png", img)
	decodeOK(t, resp, data)
	if got := f.requests.Load(); got != 3 {
		t.Errorf("JWKS fetched %d times, want 3", got)
	}
}

// TestJWTBackgroundRefresh: with the JWKS down at start, the background
// refresh alone brings the keys in, with no token asking.
func TestJWTBackgroundRefresh(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	f := newFakeJWKS(t, rs)
	f.down.Store(true)
	cfg := f.config()
	cfg.RefreshInterval = time.Second // the shortest allowed
	e := newEnv(t, envOptions{jwt: cfg})
	f.down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for e.verifier.KeyCount() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the background refresh never loaded the keys")
		}
		time.Sleep(20 * time.Millisecond) // polls a background fetch; no window is waited out
	}
	resp, data := e.post(rs.sign(t, claimsAt(time.Now())), "image/png", pngBytes(t, 8, 8))
	decodeOK(t, resp, data)
}

func TestJWTUnknownKIDFlood(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	e, f, clk := newJWTEnv(t, rs)
	img := pngBytes(t, 8, 8)
	flood := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		for i := range n {
			token := rsaKey2(t, fmt.Sprintf("forged-%d", i)).sign(t, claimsAt(clk.now()))
			wg.Go(func() {
				resp, data := e.post(token, "image/png", img)
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("forged kid: status %d: %s", resp.StatusCode, data)
				}
			})
		}
		wg.Wait()
	}
	steps := []struct {
		advance time.Duration
		fetches int64 // total, the one at start included
	}{
		{0, 2},                // the first unknown kid may fetch
		{30 * time.Minute, 2}, // half an interval later: none
		{30 * time.Minute, 3}, // a full interval after the first: one more
		{time.Hour - time.Second, 3},
		{time.Second, 4},
	}
	for i, s := range steps {
		clk.add(s.advance)
		flood(50)
		if got := f.requests.Load(); got != s.fetches {
			t.Errorf("step %d: JWKS fetched %d times, want %d", i, got, s.fetches)
		}
		// The real key keeps working through the flood.
		resp, data := e.post(rs.sign(t, claimsAt(clk.now())), "image/png", img)
		decodeOK(t, resp, data)
	}
	if got := e.jwtRefusals("unknown_kid"); got != 250 {
		t.Errorf("unknown_kid refusals %v, want 250", got)
	}
}

// FuzzAuthenticate feeds bearer tokens through layer 0 with JWT sign-in
// on. Nothing may panic, and nothing but the one valid token may get in.
func FuzzAuthenticate(f *testing.F) {
	rs, es := rsaKey(f, "rsa-1"), ecKey(f, "ec-1")
	now := jwtStart
	valid := rs.sign(f, claimsAt(now))
	seeds := []string{
		valid,
		es.sign(f, with(claimsAt(now), jwt.MapClaims{"exp": nil})),
		"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
		"a.b.c", "..", "a..c", "bw_" + strings.Repeat("A", 32), "",
		strings.Replace(valid, ".", "..", 1),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	fj := newFakeJWKS(f, rs, es)
	e := newEnv(f, envOptions{clock: func() time.Time { return now }, jwt: fj.config()})
	f.Fuzz(func(t *testing.T, token string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/ocr", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		c := e.srv.public.NewContext(req, httptest.NewRecorder())
		id, _, err := e.srv.authenticate(c)
		if tok := strings.TrimSpace(token); err == nil && tok != valid && tok != e.key {
			t.Fatalf("token %q let in as %+v", token, id)
		}
		if err != nil && err != edge.ErrUnauthorized {
			t.Fatalf("token %q: error %v, want edge.ErrUnauthorized", token, err)
		}
	})
}

// TestJWTVerifierClose: once closed (at shutdown), the verifier fetches
// nothing more and refuses every token.
func TestJWTVerifierClose(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	e, f, clk := newJWTEnv(t, rs)
	want := e.unauthorizedBody()
	e.verifier.Close()
	e.expect401(rs.sign(t, claimsAt(clk.now())), want)
	e.expect401(rsaKey2(t, "ghost").sign(t, claimsAt(clk.now())), want)
	if got := e.jwtRefusals("stopped"); got != 2 {
		t.Errorf("stopped refusals %v, want 2", got)
	}
	if got := f.requests.Load(); got != 1 {
		t.Errorf("JWKS fetched %d times, want 1", got)
	}
}

// TestJWTUserBan: a ban reaches users who sign in with a provider too,
// though they have no API key and no user record until banned.
func TestJWTUserBan(t *testing.T) {
	rs := rsaKey(t, "rsa-1")
	e, _, clk := newJWTEnv(t, rs)
	img := pngBytes(t, 16, 16)
	token := rs.sign(t, with(claimsAt(clk.now()), jwt.MapClaims{"sub": "user_jwt_ban"}))
	resp, data := e.post(token, "image/png", img)
	decodeOK(t, resp, data)
	if _, err := adminClient(e).SetBanned(context.Background(), "jwt:user_jwt_ban", true, true); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(token, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusForbidden, "banned")
	if _, err := adminClient(e).SetBanned(context.Background(), "JWT:user_jwt_ban", false, false); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(token, "image/png", img)
	decodeOK(t, resp, data)
}
