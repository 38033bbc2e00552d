package api

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/server/edge"
	"breakwater/server/guard"
	"breakwater/server/keys"
	"breakwater/server/routes"
)

// Route is one [[routes]] entry of the app with the memory of its layers,
// as the App builds and restores them.
type Route struct {
	Config   routes.Config
	Windows  *limiter.Limiter     // rate and burst, keyed by user id or client IP; required
	Attempts *budget.Attempts     // the daily line; required
	Fails    *limiter.FailLimiter // [routes.fail]; nil without one
}

// Timeouts of the calls to a route's upstream. The whole answer is also
// bounded by the server's write timeout.
const (
	routeDialTimeout   = 5 * time.Second
	routeHeaderTimeout = 60 * time.Second // the app's time to start answering
)

// routeLayer is the layer label of a route's refusals in metrics and logs:
// "route:NAME".
func routeLayer(name string) string { return "route:" + name }

// guardedRoute is a route at run time. Its limits (rate, window, burst,
// daily, max_body, mode) change live with SetRoutes; the rest is fixed at
// start.
type guardedRoute struct {
	name    string
	layer   string
	cfg     atomic.Pointer[routes.Config]
	windows *limiter.Limiter
	guard   *guard.Guard
	fails   *limiter.FailLimiter
	// failsOpen runs the fail limit's check, failing open as the guard's
	// layers do.
	failsOpen *guard.FailOpen
	proxy     *httputil.ReverseProxy // nil: forward auth only
}

// newRoutes builds the routes' guards and proxies, and the two tables
// that find them: every route for forward auth, the proxied ones for the
// public listener.
func (s *Server) newRoutes(rs []Route) error {
	all := make([]routes.Config, 0, len(rs))
	var proxied []routes.Config
	s.guarded = make(map[string]*guardedRoute, len(rs))
	s.floods = s.d.Layers.Deny.Beside(0)
	for _, r := range rs {
		if r.Windows == nil || r.Attempts == nil || (r.Config.Fail != nil && r.Fails == nil) {
			return fmt.Errorf("server: route %q needs its rate windows, its attempt counts and, with [routes.fail], its fail limiter", r.Config.Name)
		}
		cfg := r.Config.WithDefaults()
		g, err := guard.New(guard.Layers{Rate: r.Windows, Attempts: r.Attempts, Deny: s.floods}, guard.Hooks{FailedOpen: s.failOpen.note})
		if err != nil {
			return err
		}
		rt := &guardedRoute{name: cfg.Name, layer: routeLayer(cfg.Name), windows: r.Windows, guard: g, fails: r.Fails}
		rt.failsOpen = guard.NewFailOpen(rt.layer, guard.Hooks{FailedOpen: s.failOpen.note})
		rt.cfg.Store(&cfg)
		if cfg.Upstream != "" {
			target, err := url.Parse(cfg.Upstream)
			if err != nil {
				return fmt.Errorf("server: route %q: upstream: %w", cfg.Name, err)
			}
			rt.proxy = s.newProxy(target)
			proxied = append(proxied, cfg)
		}
		s.guarded[cfg.Name] = rt
		all = append(all, cfg)
	}
	var err error
	if s.allRoutes, err = routes.NewTable(all); err != nil {
		return err
	}
	s.proxyRoutes, err = routes.NewTable(proxied)
	return err
}

// SetRoutes applies the live part of each route's config: its rate,
// window, burst, daily line, max_body and mode. A route that is new, gone
// or changed in any other key keeps running as it started; the App
// reports those as needing a restart.
func (s *Server) SetRoutes(next []routes.Config) {
	for _, c := range next {
		rt := s.guarded[c.Name]
		if rt == nil {
			continue
		}
		c = c.WithDefaults()
		cur := *rt.cfg.Load()
		cur.Rate, cur.Window, cur.Burst, cur.Daily, cur.MaxBody, cur.Mode = c.Rate, c.Window, c.Burst, c.Daily, c.MaxBody, c.Mode
		rt.windows.SetConfig(cur.Limits())
		rt.cfg.Store(&cur)
	}
}

// checkFloods runs check, a fail-open layer's check by fo, for key in
// scope, unless the flood cache (s.floods) remembers a refusal of it: then
// that refusal is the answer (remembered), with what is left of its
// retry-after, and nothing is asked. An exact refusal (a limiter's rate
// or burst, a fail limit's cooldown) is remembered until its
// retry-after: on postgres a flood of one client then costs one round
// trip, not one a request. The caller reports a remembered refusal as a
// decided one.
func (s *Server) checkFloods(fo *guard.FailOpen, scope, key string, now time.Time, check func() error) (r *guard.Refusal, remembered bool) {
	if r := s.floods.Lookup(scope, key, now); r != nil {
		return r, true
	}
	gen := s.floods.Generation()
	r = fo.Check(check)
	s.floods.Keep(scope, key, r, gen, now)
	return r, false
}

// failScope is the flood cache's scope of a fail limit's refusals on
// layer ("invites", "route:NAME"), apart from its rate limit's.
func failScope(layer string) string { return layer + "/fail" }

// failSetKey is the flood cache's key of an attempt on keys: the SHA-256
// of each key with its length (so that no two sets give one key), 32
// bytes however long the keys (an e-mail, a field's value), so that the
// cache's bound holds its memory too.
func failSetKey(keys []string) string {
	h := sha256.New()
	var n [8]byte
	for _, k := range keys {
		binary.BigEndian.PutUint64(n[:], uint64(len(k)))
		h.Write(n[:])
		h.Write([]byte(k))
	}
	return string(h.Sum(nil))
}

// routeCaller is who asks on a route: the key its limits count, and the
// identity for X-Breakwater-User and X-Breakwater-Plan (zero for
// identity = "ip").
type routeCaller struct {
	key string
	id  keys.Identity
	ip  string // the client's key: its address, or its /64
}

// routeCaller establishes who asks: for identity = "user" an API key or a
// JWT (401 without, 403 when banned), keyed by user id; for identity =
// "ip" the client IP (IPv6 by /64), from trusted proxies only.
func (s *Server) routeCaller(c echo.Context, cfg *routes.Config) (routeCaller, error) {
	who := routeCaller{ip: limiter.ClientKey(c.RealIP())}
	if cfg.Identity == routes.IdentityIP {
		who.key = "ip:" + who.ip
		return who, nil
	}
	id, _, err := s.identify(c)
	if err != nil {
		return who, err
	}
	who.key, who.id = id.UserID, id
	return who, nil
}

// admitRoute runs layers 1 and 2 of a route for key: the rate and burst,
// then the daily line, counted. In shadow mode a would-be refusal is
// logged and counted in breakwater_shadow_refusals_total and the request
// passes; the layers count as they do when enforcing.
func (s *Server) admitRoute(rt *guardedRoute, cfg *routes.Config, who routeCaller, ip string, now time.Time) *guard.Refusal {
	t, r := rt.guard.Admit(guard.Request{Key: who.key, DailyLine: cfg.Daily, Route: rt.layer}, now)
	if r == nil {
		r = t.Reserve(0, now)
	}
	if r == nil {
		return nil
	}
	return s.routeRefused(rt, cfg, r, who, ip, now)
}

// routeRefused returns a refusal of a route, to be answered (and counted
// then, under the route's layer), or in shadow mode logs it, counts it as
// a shadow refusal, records it under the route's layer (the dashboard and
// breakwater usage read those rows) and returns nil.
func (s *Server) routeRefused(rt *guardedRoute, cfg *routes.Config, r *guard.Refusal, who routeCaller, ip string, now time.Time) *guard.Refusal {
	if cfg.Mode == routes.ModeShadow {
		reason := r.Reason
		s.shadowed(now, rt.layer, reason)
		s.d.Events.Record(detect.Event{Time: now, UserID: who.id.UserID, IP: ip, Route: detect.RoutePrefix + rt.name,
			Layer: rt.layer, Outcome: detect.OutcomeShadowRefused})
		if ok, held := s.routeLog.Allow(now, edge.RefusalLogInterval); ok {
			s.log.Info("shadow mode: a refusal let through", "route", rt.name, "reason", reason, "unlogged_since_last", held)
		}
		return nil
	}
	return r
}

// hasProxied reports whether a route has an upstream.
func (s *Server) hasProxied() bool {
	for _, rt := range s.guarded {
		if rt.proxy != nil {
			return true
		}
	}
	return false
}
