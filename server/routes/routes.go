// Package routes provides the [[routes]] of config.toml: the developer's
// own routes that Breakwater guards (payment entrances, a contact form,
// the app's pre-auth endpoints), each with its identity, its limits and an
// optional fail limit, and the table that finds the route a request is
// for. It knows neither HTTP serving nor storage: the transport proxies
// or answers forward-auth checks, and the guard applies the limits.
package routes

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"breakwater/limiter"
)

// Identities a route is keyed by.
const (
	IdentityUser = "user" // an API key or JWT is required (401 without); keyed by user id
	IdentityIP   = "ip"   // keyed by client IP (IPv6 by /64)
)

// Modes of a defense layer.
const (
	ModeEnforce = "enforce"
	ModeShadow  = "shadow" // would-be refusals are logged and counted; the request passes
)

// Defaults of a route.
const (
	DefaultWindow      = time.Minute
	DefaultMaxBody     = 1 << 20 // 1 MiB
	DefaultFailLimit   = 5
	DefaultFailWindow  = 10 * time.Minute
	DefaultCooldown    = 10 * time.Minute
	DefaultMaxCooldown = 24 * time.Hour
)

// DefaultFailStatuses are the app's answers that count as a failure when
// [routes.fail] names none.
var DefaultFailStatuses = []int{400, 401, 403, 404, 410, 422}

// Config is one [[routes]] entry.
type Config struct {
	// Name is unique: letters, digits, '-' and '_'; used in metrics, logs
	// and /v1/forward-auth/NAME. Required.
	Name string `koanf:"name"`
	// Methods the route matches; empty: every method.
	Methods []string `koanf:"methods"`
	// Path is an exact path, or a prefix when it ends in "/*"
	// ("/api/billing/*", which also matches "/api/billing"). Required.
	// Requests are matched on their normalized path (see Normalize).
	Path string `koanf:"path"`
	// CaseSensitive matches the path with its letters' case as written;
	// false (the default) matches "/API/Checkout" as "/api/checkout",
	// since most web frameworks serve both as one route.
	CaseSensitive bool `koanf:"case_sensitive"`
	// Upstream is where allowed requests are proxied (http or https URL);
	// empty: the route is checked by forward auth only.
	Upstream string `koanf:"upstream"`
	// Identity is IdentityUser or IdentityIP. Required.
	Identity string `koanf:"identity"`
	// Rate is the most requests per key in any interval of length Window
	// (an exact sliding window); 0 off.
	Rate int `koanf:"rate"`
	// Window is the rate limit's window, 1s to 1h. Default 1m.
	Window time.Duration `koanf:"window"`
	// Burst is the most requests per key in any one second; 0 off.
	Burst int `koanf:"burst"`
	// Daily is the most requests per key per calendar day in
	// budget.timezone; 0 off.
	Daily int64 `koanf:"daily"`
	// MaxBody is the largest request body, in bytes; larger gets 413
	// before the body is read. Default 1 MiB.
	MaxBody int64 `koanf:"max_body"`
	// Mode is ModeEnforce (the default) or ModeShadow.
	Mode string `koanf:"mode"`
	// Fail is the optional fail limit, judged by the app's own answers;
	// it needs Upstream. Nil: none.
	Fail *FailConfig `koanf:"fail"`
}

// FailConfig is a [routes.fail] section.
type FailConfig struct {
	// Statuses are the app's answers that count as a failure. Default
	// DefaultFailStatuses.
	Statuses []int `koanf:"statuses"`
	// By are the keys each limited on its own: "ip", or "json:FIELD" for a
	// top-level string field of a JSON body (trimmed and lower-cased).
	// Default ["ip"].
	By []string `koanf:"by"`
	// Limit is how many consecutive failures, each within Window of the
	// previous attempt, start a cooldown. Default 5.
	Limit int `koanf:"limit"`
	// Window is the longest gap within one run of failures. Default 10m.
	Window time.Duration `koanf:"window"`
	// Cooldown is how long a key is refused once Limit is reached.
	// Default 10m.
	Cooldown time.Duration `koanf:"cooldown"`
	// Backoff doubles each further cooldown within 24h, up to
	// MaxCooldown. Default false.
	Backoff bool `koanf:"backoff"`
	// MaxCooldown caps a doubled cooldown. Default 24h.
	MaxCooldown time.Duration `koanf:"max_cooldown"`
	// ResetOnSuccess: true (the default) clears the run on a success;
	// false takes one failure off it.
	ResetOnSuccess *bool `koanf:"reset_on_success"`
	// UniformStatus, when not 0, answers every counted failure of the app
	// and every fail-limit refusal with this status and one identical
	// body. Default 0: off.
	UniformStatus int `koanf:"uniform_status"`
}

// WithDefaults returns c with every zero field that has a default set to
// it.
func (c Config) WithDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.Mode == "" {
		c.Mode = ModeEnforce
	}
	methods := make([]string, len(c.Methods))
	for i, m := range c.Methods {
		methods[i] = strings.ToUpper(strings.TrimSpace(m))
	}
	c.Methods = methods
	if c.Fail != nil {
		f := c.Fail.WithDefaults()
		c.Fail = &f
	}
	return c
}

// WithDefaults returns f with every zero field set to its default.
func (f FailConfig) WithDefaults() FailConfig {
	if len(f.Statuses) == 0 {
		f.Statuses = slices.Clone(DefaultFailStatuses)
	}
	if len(f.By) == 0 {
		f.By = []string{"ip"}
	}
	if f.Limit == 0 {
		f.Limit = DefaultFailLimit
	}
	if f.Window == 0 {
		f.Window = DefaultFailWindow
	}
	if f.Cooldown == 0 {
		f.Cooldown = DefaultCooldown
	}
	if f.MaxCooldown == 0 {
		f.MaxCooldown = DefaultMaxCooldown
	}
	if f.ResetOnSuccess == nil {
		reset := true
		f.ResetOnSuccess = &reset
	}
	return f
}

// Limits is the route's rate and burst in the limiter's terms.
func (c Config) Limits() limiter.Config {
	return limiter.Config{Rate: c.Rate, Window: c.Window, Burst: c.Burst}
}

// Limiter is the route's fail limit in the limiter's terms.
func (f FailConfig) Limiter() limiter.FailConfig {
	return limiter.FailConfig{
		Limit: f.Limit, Window: f.Window, Cooldown: f.Cooldown, Backoff: f.Backoff, MaxCooldown: f.MaxCooldown,
		Decay: f.ResetOnSuccess != nil && !*f.ResetOnSuccess,
	}.WithDefaults()
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// reserved are the paths Breakwater answers itself.
var reserved = []string{"/v1/", "/healthz"}

// Validate checks every route, each error naming the route and its key.
func Validate(routes []Config) error {
	var errs []error
	names := map[string]bool{}
	for i, r := range routes {
		r = r.WithDefaults()
		where := fmt.Sprintf("routes[%d]", i)
		if r.Name != "" {
			where = fmt.Sprintf("routes %q", r.Name)
		}
		bad := func(key, format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s: %s", where, key, fmt.Sprintf(format, args...)))
		}
		switch {
		case !namePattern.MatchString(r.Name):
			bad("name", "must be 1 to 64 letters, digits, '-' or '_', got %q", r.Name)
		case names[r.Name]:
			bad("name", "two routes are named %q", r.Name)
		}
		names[r.Name] = true
		if err := checkPath(r.Path); err != nil {
			bad("path", "%v", err)
		}
		for _, m := range r.Methods {
			if !validMethod(m) {
				bad("methods", "%q is not an HTTP method", m)
			}
		}
		if r.Identity != IdentityUser && r.Identity != IdentityIP {
			bad("identity", "must be %q or %q, got %q", IdentityUser, IdentityIP, r.Identity)
		}
		if r.Upstream != "" {
			if u, err := url.Parse(r.Upstream); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad("upstream", "must be an http or https URL such as \"http://127.0.0.1:3000\", got %q", r.Upstream)
			}
		}
		if err := r.Limits().Validate(""); err != nil {
			bad("rate/window/burst", "%v", err)
		}
		if r.Daily < 0 {
			bad("daily", "must not be negative, got %d", r.Daily)
		}
		if r.MaxBody < 0 {
			bad("max_body", "must not be negative, got %d", r.MaxBody)
		}
		if r.Mode != ModeEnforce && r.Mode != ModeShadow {
			bad("mode", "must be %q or %q, got %q", ModeEnforce, ModeShadow, r.Mode)
		}
		if r.Fail != nil {
			if r.Upstream == "" {
				bad("fail", "a fail limit is judged by the app's answers, which a forward-auth check never sees: set upstream and route these paths through Breakwater")
			}
			if err := checkFail(*r.Fail); err != nil {
				bad("fail", "%v", err)
			}
		}
	}
	return errors.Join(errs...)
}

func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("must start with /, got %q", p)
	}
	if strings.Contains(strings.TrimSuffix(p, "/*"), "*") || strings.ContainsAny(p, "?#") {
		return fmt.Errorf("%q: a path is exact, or a prefix ending in \"/*\"; no other wildcard, query or fragment", p)
	}
	if strings.Contains(p, ";") {
		return fmt.Errorf("%q: a request's ;parameters are removed before it is matched, so a path with ';' would never match", p)
	}
	base, isPrefix := routeBase(p)
	if base == "" {
		return fmt.Errorf("%q is not a path (a bad %%-escape or a control character)", p)
	}
	// Compared without case: a route's own case_sensitive does not make
	// it safe to shadow what Breakwater answers.
	lb := strings.ToLower(base)
	for _, r := range reserved {
		r = strings.TrimSuffix(r, "/")
		covered := lb == r || strings.HasPrefix(lb, r+"/")
		covers := isPrefix && (lb == "/" || strings.HasPrefix(r, lb+"/"))
		if covered || covers {
			return fmt.Errorf("%q overlaps %s, which Breakwater answers itself", p, r)
		}
	}
	return nil
}

// routeBase is a route's path normalized, without the "/*" of a prefix
// route; "" if it does not normalize.
func routeBase(p string) (base string, isPrefix bool) {
	p, isPrefix = strings.CutSuffix(p, "*")
	base, err := Normalize(p)
	if err != nil {
		return "", isPrefix
	}
	return base, isPrefix
}

func validMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return true
	}
	return false
}

func checkFail(f FailConfig) error {
	var errs []error
	for _, s := range f.Statuses {
		if s < 100 || s > 599 {
			errs = append(errs, fmt.Errorf("statuses: %d is not an HTTP status", s))
		}
	}
	for _, by := range f.By {
		field, isJSON := strings.CutPrefix(by, "json:")
		if by != "ip" && (!isJSON || field == "") {
			errs = append(errs, fmt.Errorf("by: %q must be \"ip\" or \"json:FIELD\"", by))
		}
	}
	switch {
	case f.Limit < 1:
		errs = append(errs, fmt.Errorf("limit: must be at least 1, got %d", f.Limit))
	case f.Window < 0 || f.Cooldown < 0 || f.MaxCooldown < 0:
		errs = append(errs, errors.New("window, cooldown and max_cooldown must not be negative"))
	case f.MaxCooldown < f.Cooldown:
		errs = append(errs, fmt.Errorf("max_cooldown: %s is shorter than cooldown %s", f.MaxCooldown, f.Cooldown))
	}
	if f.UniformStatus != 0 && (f.UniformStatus < 400 || f.UniformStatus > 499) {
		errs = append(errs, fmt.Errorf("uniform_status: must be 0 (off) or a 4xx status, got %d", f.UniformStatus))
	}
	return errors.Join(errs...)
}

// Table finds the route a request is for. It is read-only once built.
type Table struct {
	exact  map[string][]entry // by normalized path, lower-cased; the routes of a path in the order listed
	prefix []entry            // longest prefix first
	byName map[string]*Config
	lens   []int // the lengths of the exact paths, lower-cased, longest first: where a format suffix can begin
}

// entry is a route as the table matches it: its normalized path (without
// the "/*" of a prefix), as written and lower-cased.
type entry struct {
	cfg        *Config
	path, fold string
}

// matches reports whether the route's path is p (lower-cased: lp), or for
// a prefix route whether p is the prefix or lies below it.
func (e entry) matches(p, lp string, prefix bool) bool {
	want, got := e.fold, lp
	if e.cfg.CaseSensitive {
		want, got = e.path, p
	}
	if !prefix {
		return got == want
	}
	return want == "/" || got == want || (strings.HasPrefix(got, want) && got[len(want)] == '/')
}

// withFormat reports whether p (lower-cased: lp) is the route's path with
// a format suffix: a '.' and more, in its last segment.
func (e entry) withFormat(p, lp string) bool {
	want, got := e.fold, lp
	if e.cfg.CaseSensitive {
		want, got = e.path, p
	}
	return len(got) > len(want) && got[len(want)] == '.' && strings.HasPrefix(got, want) &&
		strings.IndexByte(got[len(want):], '/') < 0
}

// NewTable builds the table of routes (validated, defaults applied).
func NewTable(routes []Config) (*Table, error) {
	if err := Validate(routes); err != nil {
		return nil, err
	}
	t := &Table{exact: map[string][]entry{}, byName: map[string]*Config{}}
	for _, r := range routes {
		r := r.WithDefaults()
		t.byName[r.Name] = &r
		base, isPrefix := routeBase(r.Path)
		e := entry{cfg: &r, path: base, fold: strings.ToLower(base)}
		if isPrefix {
			t.prefix = append(t.prefix, e)
			continue
		}
		t.exact[e.fold] = append(t.exact[e.fold], e)
	}
	for fold := range t.exact {
		if !slices.Contains(t.lens, len(fold)) {
			t.lens = append(t.lens, len(fold))
		}
	}
	slices.Sort(t.lens)
	slices.Reverse(t.lens) // the longest path first, as among prefixes
	slices.SortStableFunc(t.prefix, func(a, b entry) int { return len(b.path) - len(a.path) })
	return t, nil
}

// Match returns the route for method and path p, a path as Normalize
// returns it: an exact path beats the longest prefix; among routes of one
// path, the first listed whose methods include method (HEAD counts as
// GET, which frameworks answer it with). Letters' case is ignored unless
// the route is case_sensitive. A path that is a route's path with a
// format suffix in its last segment ("/api/checkout.json") is that route
// when no route has it as it is: Rails serves it as "/api/checkout" with
// the format "json", Spring's suffix patterns too. A POST that no route
// of its method matches is the route of its path whatever the route's
// methods: Rails, Laravel, Symfony and Express's method-override make a
// POST any other method by a form field or header (_method,
// X-HTTP-Method-Override) that a check does not see. nil: no route.
func (t *Table) Match(method, p string) *Config {
	method = strings.ToUpper(method)
	if r := t.find(method, p, false); r != nil || method != http.MethodPost {
		return r
	}
	return t.find("", p, true)
}

// MatchPath returns the first route whose path matches p, whatever its
// methods; nil: none.
func (t *Table) MatchPath(p string) *Config { return t.find("", p, true) }

// find is the route of p: an exact path as it is, then as a route's path
// with a format suffix, then the longest prefix (with a format suffix if
// p is the prefix's own path). The exact paths with a suffix are looked
// up at the lengths of the routes' paths alone, so that a last segment of
// many dots costs no more than one of a few.
func (t *Table) find(method, p string, anyMethod bool) *Config {
	lp := strings.ToLower(p) // no copy unless p has upper-case letters
	for _, e := range t.exact[lp] {
		if e.matches(p, lp, false) && (anyMethod || e.cfg.allows(method)) {
			return e.cfg
		}
	}
	for _, n := range t.lens {
		if n < len(lp) && lp[n] == '.' {
			for _, e := range t.exact[lp[:n]] {
				if e.withFormat(p, lp) && (anyMethod || e.cfg.allows(method)) {
					return e.cfg
				}
			}
		}
	}
	for _, e := range t.prefix {
		if (e.matches(p, lp, true) || e.withFormat(p, lp)) && (anyMethod || e.cfg.allows(method)) {
			return e.cfg
		}
	}
	return nil
}

// Named returns the route called name, nil if there is none.
func (t *Table) Named(name string) *Config { return t.byName[name] }

// All returns the routes in no particular order.
func (t *Table) All() []*Config {
	out := make([]*Config, 0, len(t.byName))
	for _, r := range t.byName {
		out = append(out, r)
	}
	return out
}

func (c *Config) allows(method string) bool {
	if len(c.Methods) == 0 || slices.Contains(c.Methods, method) {
		return true
	}
	return method == http.MethodHead && slices.Contains(c.Methods, http.MethodGet)
}
