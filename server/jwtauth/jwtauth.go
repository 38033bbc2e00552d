// Package jwtauth verifies the session tokens of a hosted sign-in provider
// (Clerk, Auth0, Supabase) against its JSON Web Key Set, which it fetches,
// caches and refreshes in the background, and turns a valid token into the
// identity of a JWT user ("jwt:" + sub). It accepts one asymmetric
// algorithm per key type and nothing else; it knows no HTTP routes and
// says why a token was refused only to its caller, never to the client.
package jwtauth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"breakwater/server/keys"
	"breakwater/server/keys/userid"
)

// KeyID is the Identity.KeyID of a JWT user, who has no API key.
const KeyID = "jwt"

// Defaults and bounds for Config and the Verifier.
const (
	// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
	DefaultLeeway = 5 * time.Second
	// DefaultRefreshInterval is how often the JWKS is fetched again,
	// and the shortest time between two fetches caused by unknown kids.
	DefaultRefreshInterval = 5 * time.Minute
	// MaxTokenBytes is the longest bearer token the verifier looks at; a
	// longer one is refused before any parsing.
	MaxTokenBytes = 8 << 10

	maxJWTLeeway     = 5 * time.Minute
	minJWKSRefresh   = time.Second
	maxKIDBytes      = 256
	maxJWKSBytes     = 1 << 20          // a JWKS is a few KiB; more is not a key set
	jwksFetchTimeout = 10 * time.Second // one JWKS fetch, in the background or for an unknown kid
	maxJWKSRedirects = 3
	minRSAKeyBits    = 2048
	jwtAlgRS256      = "RS256"
	jwtAlgES256      = "ES256"
	jwtAlgEdDSA      = "EdDSA"
)

// The reasons of a Refusal, the values of the metric's reason label.
const (
	refusalAlgorithm    = "algorithm"
	refusalUnknownKID   = "unknown_kid"
	refusalNoKeys       = "no_keys"
	refusalMissingExp   = "missing_exp"
	refusalSubject      = "subject"
	refusalNotYetValid  = "not_yet_valid"
	refusalAuthorized   = "azp"
	refusalKeyMismatch  = "key_mismatch"
	refusalSignature    = "signature"
	refusalMalformed    = "malformed"
	refusalTooLong      = "too_long"
	refusalNoKID        = "no_kid"
	refusalExpired      = "expired"
	refusalIssuer       = "issuer"
	refusalAudience     = "audience"
	refusalClaims       = "claims"
	refusalVerifierGone = "stopped"
)

// jwtMethods are the only algorithms accepted: one per key type, so a key
// can never be used with an algorithm it was not made for. "none" and the
// HMAC family are absent on purpose: a shared secret has no place in a
// public JWKS.
var jwtMethods = []string{jwtAlgRS256, jwtAlgES256, jwtAlgEdDSA}

// Config is the [auth.jwt] section of config.toml: sign-in through a
// hosted provider (Clerk, Auth0, Supabase) whose session tokens are
// verified against its JWKS. With JWKSURL empty, JWT sign-in is off and
// only API keys are accepted.
type Config struct {
	// JWKSURL is the provider's JSON Web Key Set, https (http only on a
	// loopback host). Empty: JWT sign-in is off.
	JWKSURL string `koanf:"jwks_url"`
	// Issuer must equal the token's iss claim exactly. Required when on.
	Issuer string `koanf:"issuer"`
	// Audience, when set, must be one of the token's aud values.
	Audience string `koanf:"audience"`
	// AuthorizedParties, when set, lists the accepted azp values (Clerk
	// puts the origin of the signing-in page there); a token without azp
	// is then refused.
	AuthorizedParties []string `koanf:"authorized_parties"`
	// PlanClaim names a top-level string claim holding the user's plan.
	// Empty, absent, or naming no plan of config.toml: DefaultPlan.
	PlanClaim string `koanf:"plan_claim"`
	// DefaultPlan is the plan of a JWT user whose token names none.
	// Default "free"; it must be defined in [plans].
	DefaultPlan string `koanf:"default_plan"`
	// Leeway is the clock skew allowed on exp, nbf and iat. Default 5s,
	// at most 5m.
	Leeway time.Duration `koanf:"leeway"`
	// RefreshInterval is how often the JWKS is fetched again, and the
	// shortest time between two fetches caused by tokens with an unknown
	// kid. Default 5m, at least 1s.
	RefreshInterval time.Duration `koanf:"refresh_interval"`
}

// Enabled tells whether JWT sign-in is on.
func (c Config) Enabled() bool { return c.JWKSURL != "" }

// WithDefaults returns c with every zero field set to its documented default.
func (c Config) WithDefaults() Config {
	if c.DefaultPlan == "" {
		c.DefaultPlan = keys.DefaultPlan
	}
	if c.Leeway == 0 {
		c.Leeway = DefaultLeeway
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	return c
}

// Validate reports the invalid settings, naming their keys. Whether
// DefaultPlan exists is for the caller, who knows the plans.
func (c Config) Validate() error {
	if !c.Enabled() {
		if c.Issuer != "" || c.Audience != "" || len(c.AuthorizedParties) > 0 || c.PlanClaim != "" {
			return errors.New("auth.jwt.jwks_url: empty, so JWT sign-in is off, yet other auth.jwt keys are set: set jwks_url or remove them")
		}
		return nil
	}
	var errs []error
	if err := checkJWKSURL(c.JWKSURL); err != nil {
		errs = append(errs, err)
	}
	if c.Issuer == "" {
		errs = append(errs, errors.New("auth.jwt.issuer: required when auth.jwt.jwks_url is set"))
	}
	for _, p := range c.AuthorizedParties {
		if strings.TrimSpace(p) == "" {
			errs = append(errs, errors.New("auth.jwt.authorized_parties: an entry is empty"))
			break
		}
	}
	if c.DefaultPlan == "" {
		errs = append(errs, errors.New("auth.jwt.default_plan: must not be empty"))
	}
	if c.Leeway < 0 || c.Leeway > maxJWTLeeway {
		errs = append(errs, fmt.Errorf("auth.jwt.leeway: must be between 0s and %s, got %s", maxJWTLeeway, c.Leeway))
	}
	if c.RefreshInterval < minJWKSRefresh {
		errs = append(errs, fmt.Errorf("auth.jwt.refresh_interval: must be at least %s, got %s", minJWKSRefresh, c.RefreshInterval))
	}
	return errors.Join(errs...)
}

// checkJWKSURL accepts an absolute https URL, or http on a loopback host:
// keys fetched in the clear could be swapped on the way.
func checkJWKSURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("auth.jwt.jwks_url: %q is not an absolute http(s) URL", raw)
	}
	if u.Scheme == "http" {
		host := u.Hostname()
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("auth.jwt.jwks_url: %q must use https (http is allowed only on a loopback host)", raw)
		}
	}
	return nil
}

// Refusal is why a token was refused. Its Reason is a short, stable
// label for logs and the breakwater_jwt_refusals_total metric; the client
// never sees it.
type Refusal struct {
	Reason string
	Err    error // the underlying error, if any
}

func (r *Refusal) Error() string {
	if r.Err == nil {
		return "jwt refused: " + r.Reason
	}
	return "jwt refused: " + r.Reason + ": " + r.Err.Error()
}

func (r *Refusal) Unwrap() error { return r.Err }

func refuse(reason string, err error) *Refusal { return &Refusal{Reason: reason, Err: err} }

// Options are the Verifier's optional dependencies.
type Options struct {
	// Client fetches the JWKS. Default: a client of our own with a 10 s
	// timeout. Its responses are held to 1 MiB either way.
	Client *http.Client
	Logger *slog.Logger
	// Now is the clock for exp, nbf, iat and the unknown-kid limit.
	// Default time.Now.
	Now func() time.Time
}

// Verifier checks JWTs against a provider's JWKS, which keyfunc fetches,
// caches and refreshes in the background. Keys once fetched stay in use
// while the JWKS endpoint is down. A token whose kid is not in the cache
// may cause one fetch per refresh interval, no matter how many such tokens
// arrive; the others are refused at once, never queued.
type Verifier struct {
	cfg       Config
	knownPlan func(string) bool
	now       func() time.Time
	log       *slog.Logger
	parser    *jwt.Parser
	keys      jwkset.Storage
	ctx       context.Context
	stop      context.CancelFunc

	mu         sync.Mutex
	unknownKID *rate.Limiter // fetches caused by unknown kids
	inflight   chan struct{} // closed when the running unknown-kid fetch ends; nil when none runs
}

// NewVerifier starts the JWKS fetcher for cfg (taken with its defaults)
// and returns the verifier. A JWKS that cannot be fetched now is not an
// error: it is logged, JWTs are refused until keys arrive, and fetching
// goes on in the background. knownPlan tells whether a plan exists. The
// fetcher runs until ctx ends or Close is called.
func NewVerifier(ctx context.Context, cfg Config, knownPlan func(string) bool, o Options) (*Verifier, error) {
	cfg = cfg.WithDefaults()
	if !cfg.Enabled() {
		return nil, errors.New("jwtauth: the verifier needs auth.jwt.jwks_url")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if knownPlan == nil {
		return nil, errors.New("jwtauth: the verifier needs a plan check")
	}
	if !knownPlan(cfg.DefaultPlan) {
		return nil, fmt.Errorf("auth.jwt.default_plan: %w %q", keys.ErrUnknownPlan, cfg.DefaultPlan)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	client := &http.Client{Timeout: jwksFetchTimeout}
	if o.Client != nil {
		c := *o.Client
		client = &c
	}
	base := client.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	client.Transport = limitedBodies{base: base, max: maxJWKSBytes}
	// A redirect must meet the rule jwks_url meets: no hop to plain http
	// off this machine, where the keys could be swapped.
	client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxJWKSRedirects {
			return fmt.Errorf("JWKS: more than %d redirects", maxJWKSRedirects)
		}
		if err := checkJWKSURL(req.URL.String()); err != nil {
			return fmt.Errorf("JWKS redirect to %s refused: %w", req.URL.Redacted(), err)
		}
		return nil
	}

	v := &Verifier{
		cfg:       cfg,
		knownPlan: knownPlan,
		now:       o.Now,
		log:       o.Logger.With("component", "jwt"),
		// The limiter starts full: the first unknown kid may fetch at once.
		unknownKID: rate.NewLimiter(rate.Every(cfg.RefreshInterval), 1),
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(jwtMethods),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithIssuer(cfg.Issuer),
		jwt.WithTimeFunc(v.now),
		jwt.WithStrictDecoding(),
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)

	v.ctx, v.stop = context.WithCancel(ctx)
	noErrorOnFirstFetch := true
	kf, err := keyfunc.NewDefaultOverrideCtx(v.ctx, []string{cfg.JWKSURL}, keyfunc.Override{
		Client:                    client,
		HTTPTimeout:               jwksFetchTimeout,
		NoErrorReturnFirstHTTPReq: &noErrorOnFirstFetch,
		RefreshInterval:           cfg.RefreshInterval,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(_ context.Context, err error) {
				v.log.Warn("JWKS fetch failed: cached keys stay in use", "url", u, "err", err)
			}
		},
		// keyfunc waits on this limiter before it fetches for an unknown
		// kid, holding the request meanwhile. Our own non-blocking limit
		// decides instead (see key), so this one never makes anyone wait;
		// RateLimitWaitMax then only bounds that fetch.
		RefreshUnknownKID: rate.NewLimiter(rate.Inf, 1),
		RateLimitWaitMax:  jwksFetchTimeout,
	})
	if err != nil {
		v.stop()
		return nil, fmt.Errorf("auth.jwt.jwks_url: %w", err)
	}
	v.keys = kf.Storage()
	if n := v.KeyCount(); n == 0 {
		v.log.Warn("no JWKS keys yet: JWTs are refused until they arrive", "url", cfg.JWKSURL, "refresh_interval", cfg.RefreshInterval)
	} else {
		v.log.Info("JWKS loaded", "url", cfg.JWKSURL, "keys", n)
	}
	return v, nil
}

// Close stops the background fetcher and any fetch in flight.
func (v *Verifier) Close() { v.stop() }

// IsJWT tells whether token is for the verifier rather than the API-key
// keyring: three dot-separated base64url segments, or anything too long
// to be an API key or an acceptable JWT.
func IsJWT(token string) bool {
	if len(token) > MaxTokenBytes {
		return true
	}
	return jwtShaped(token)
}

// jwtShaped: header.payload.signature, each of base64url letters without
// padding; header and payload are not empty (the signature of an "alg":
// "none" token is, and such a token must reach the verifier to be
// refused there).
func jwtShaped(token string) bool {
	dots, segLen := 0, 0
	for i := 0; i < len(token); i++ {
		c := token[i]
		switch {
		case c == '.':
			if segLen == 0 || dots == 2 {
				return false
			}
			dots, segLen = dots+1, 0
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
			segLen++
		default:
			return false
		}
	}
	return dots == 2
}

// Verify checks token and returns the identity it carries. Every error is
// a *Refusal.
func (v *Verifier) Verify(ctx context.Context, token string) (keys.Identity, error) {
	if len(token) > MaxTokenBytes {
		return keys.Identity{}, refuse(refusalTooLong, nil)
	}
	if !jwtShaped(token) {
		return keys.Identity{}, refuse(refusalMalformed, nil)
	}
	if v.ctx.Err() != nil {
		return keys.Identity{}, refuse(refusalVerifierGone, nil)
	}
	claims := jwt.MapClaims{}
	tok, err := v.parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) { return v.key(ctx, t) })
	if err != nil {
		return keys.Identity{}, classify(tok, claims, err)
	}
	if len(v.cfg.AuthorizedParties) > 0 {
		azp, _ := claims["azp"].(string)
		if !slices.Contains(v.cfg.AuthorizedParties, azp) {
			return keys.Identity{}, refuse(refusalAuthorized, fmt.Errorf("azp %q", azp))
		}
	}
	// The user is "jwt:" + sub: a token never acts as an API-key user,
	// whatever its sub.
	sub, err := claims.GetSubject()
	var user string
	if err == nil {
		user, err = userid.JWT(sub)
	}
	if err != nil {
		return keys.Identity{}, refuse(refusalSubject, err)
	}
	plan := v.cfg.DefaultPlan
	if v.cfg.PlanClaim != "" {
		if p, ok := claims[v.cfg.PlanClaim].(string); ok && v.knownPlan(p) {
			plan = p
		}
	}
	return keys.Identity{UserID: user, KeyID: KeyID, Plan: plan}, nil
}

// classify turns the parser's error into a refusal reason. Claim errors
// come joined; the first matching reason in this order wins.
func classify(tok *jwt.Token, claims jwt.MapClaims, err error) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r // from key
	}
	if errors.Is(err, jwt.ErrTokenMalformed) || tok == nil {
		return refuse(refusalMalformed, err)
	}
	if alg, _ := tok.Header["alg"].(string); !slices.Contains(jwtMethods, alg) {
		return refuse(refusalAlgorithm, err)
	}
	reasons := []struct {
		target error
		reason string
	}{
		{jwt.ErrTokenSignatureInvalid, refusalSignature},
		{jwt.ErrTokenUnverifiable, refusalSignature},
		{jwt.ErrTokenExpired, refusalExpired},
		{jwt.ErrTokenNotValidYet, refusalNotYetValid},
		{jwt.ErrTokenUsedBeforeIssued, refusalNotYetValid},
		{jwt.ErrTokenInvalidIssuer, refusalIssuer},
		{jwt.ErrTokenInvalidAudience, refusalAudience},
	}
	for _, c := range reasons {
		if errors.Is(err, c.target) {
			return refuse(c.reason, err)
		}
	}
	if errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
		switch {
		case claims["exp"] == nil:
			return refuse(refusalMissingExp, err)
		case claims["iss"] == nil:
			return refuse(refusalIssuer, err)
		default:
			return refuse(refusalAudience, err)
		}
	}
	return refuse(refusalClaims, err)
}

// key finds the public key for t, whose alg the parser has already
// checked against jwtMethods, and makes sure the key is of the kind that
// alg needs.
func (v *Verifier) key(ctx context.Context, t *jwt.Token) (any, error) {
	alg, _ := t.Header["alg"].(string)
	kid, _ := t.Header["kid"].(string)
	if kid == "" || len(kid) > maxKIDBytes {
		return nil, refuse(refusalNoKID, nil)
	}
	jwk, ok := v.cached(kid)
	if !ok {
		var err error
		if jwk, err = v.fetchFor(ctx, kid); err != nil {
			return nil, err
		}
	}
	return publicKeyFor(alg, jwk)
}

// cached looks kid up among the keys already fetched, without fetching.
func (v *Verifier) cached(kid string) (jwkset.JWK, bool) {
	all, err := v.keys.KeyReadAll(v.ctx)
	if err != nil {
		return jwkset.JWK{}, false
	}
	for _, k := range all {
		if k.Marshal().KID == kid {
			return k, true
		}
	}
	return jwkset.JWK{}, false
}

// KeyCount is how many keys the verifier holds from the JWKS.
func (v *Verifier) KeyCount() int {
	all, _ := v.keys.KeyReadAll(v.ctx)
	return len(all)
}

// fetchFor fetches the JWKS again for an unknown kid, at most once per
// refresh interval. While one such fetch runs, other unknown kids wait for
// it (a rotation reaches many users at once); when none runs and the
// interval has not passed, the token is refused at once.
func (v *Verifier) fetchFor(ctx context.Context, kid string) (jwkset.JWK, error) {
	v.mu.Lock()
	if ch := v.inflight; ch != nil {
		v.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return jwkset.JWK{}, refuse(refusalUnknownKID, ctx.Err())
		}
		if jwk, ok := v.cached(kid); ok {
			return jwk, nil
		}
		return jwkset.JWK{}, v.unknown(kid)
	}
	if !v.unknownKID.AllowN(v.now(), 1) {
		v.mu.Unlock()
		return jwkset.JWK{}, v.unknown(kid)
	}
	ch := make(chan struct{})
	v.inflight = ch
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		v.inflight = nil
		v.mu.Unlock()
		close(ch)
	}()

	v.log.Info("unknown kid: fetching the JWKS again", "kid", kid)
	// The fetch is the verifier's, not the request's: a client that hangs
	// up must not cut short the fetch that others wait for.
	jwk, err := v.keys.KeyRead(v.ctx, kid) // a miss in the cache fetches
	if err != nil {
		return jwkset.JWK{}, v.unknown(kid)
	}
	return jwk, nil
}

func (v *Verifier) unknown(kid string) *Refusal {
	if v.KeyCount() == 0 {
		return refuse(refusalNoKeys, nil)
	}
	return refuse(refusalUnknownKID, fmt.Errorf("kid %q", kid))
}

// publicKeyFor returns jwk's public key if it is meant for signatures and
// is the kind of key alg needs: RSA of 2048 bits or more for RS256, P-256
// for ES256, Ed25519 for EdDSA.
func publicKeyFor(alg string, jwk jwkset.JWK) (any, error) {
	m := jwk.Marshal()
	if m.USE != "" && m.USE != jwkset.UseSig {
		return nil, refuse(refusalKeyMismatch, fmt.Errorf("key %q is for %q, not signatures", m.KID, m.USE))
	}
	if a := m.ALG.String(); a != "" && a != alg {
		return nil, refuse(refusalKeyMismatch, fmt.Errorf("key %q is for %s, token says %s", m.KID, a, alg))
	}
	key := jwk.Key()
	if pk, ok := key.(interface{ Public() crypto.PublicKey }); ok {
		key = pk.Public()
	}
	ok := false
	switch k := key.(type) {
	case *rsa.PublicKey:
		ok = alg == jwtAlgRS256 && k.N.BitLen() >= minRSAKeyBits
	case *ecdsa.PublicKey:
		ok = alg == jwtAlgES256 && k.Curve == elliptic.P256()
	case ed25519.PublicKey:
		ok = alg == jwtAlgEdDSA
	}
	if !ok {
		return nil, refuse(refusalKeyMismatch, fmt.Errorf("key %q (%s) does not fit %s", m.KID, m.KTY, alg))
	}
	return key, nil
}

// limitedBodies holds every response body to max bytes: a JWKS endpoint
// that streams without end must not fill the memory.
type limitedBodies struct {
	base http.RoundTripper
	max  int64
}

func (l limitedBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: l.max}
	return resp, nil
}

var errJWKSTooLarge = errors.New("jwtauth: JWKS response larger than 1 MiB")

type cappedBody struct {
	io.ReadCloser
	left int64
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// One byte more tells a body of exactly max from a longer one.
		var one [1]byte
		n, err := c.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, errJWKSTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= int64(n)
	return n, err
}
