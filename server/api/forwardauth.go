package api

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/detect"
	"breakwater/server/edge"
	"breakwater/server/routes"
)

// The headers a proxy names the original request in: Caddy and Traefik
// send X-Forwarded-Method and X-Forwarded-Uri, nginx (as the snippet in
// docs/ROUTES.md sets them) X-Original-Method and X-Original-URI.
const (
	headerForwardedMethod = "X-Forwarded-Method"
	headerForwardedURI    = "X-Forwarded-Uri"
	headerOriginalMethod  = "X-Original-Method"
	headerOriginalURI     = "X-Original-URI"
	// headerStatus carries the status of every forward-auth refusal, for
	// nginx, whose auth_request passes on only 401 and 403.
	headerStatus = "X-Breakwater-Status"
)

// handleForwardAuth answers a proxy's question whether a request may pass
// (GET /v1/forward-auth/NAME, or /v1/forward-auth with the route found
// from the original method and URI): 200 with X-Breakwater-User and
// X-Breakwater-Plan, or the refusal the proxy would have got. Under
// nginx's convention a refusal other than 401 or 403 is answered as 403,
// its own status in X-Breakwater-Status (Retry-After kept), since
// auth_request turns any other status into a 500.
func (s *Server) handleForwardAuth(c echo.Context) error {
	err := s.forwardAuth(c, s.now())
	if err == nil {
		return c.NoContent(http.StatusOK)
	}
	p := edge.ToProblem(err)
	c.Response().Header().Set(headerStatus, strconv.Itoa(p.Status))
	if isNginx(c.Request().Header) && p.Status != http.StatusUnauthorized && p.Status != http.StatusForbidden {
		q := *p
		q.Status = http.StatusForbidden
		return &q
	}
	return p
}

func isNginx(h http.Header) bool {
	return h.Get(headerOriginalURI) != "" || h.Get(headerOriginalMethod) != ""
}

// forwardAuth checks one forward-auth request; nil: allowed, and the
// identity headers are set (empty but for a user route). A request that matches no
// route passes with an empty identity, no event and no write: the proxy sends
// every request of the app here, so that no spelling of a guarded path
// gets past.
func (s *Server) forwardAuth(c echo.Context, now time.Time) error {
	r := c.Request()
	if !s.edge.FromTrustedProxy(r) {
		return errUntrustedProxy
	}
	if hasIdentityHeader(r.Header) {
		return errClientIdentityHeader
	}
	route, err := s.forwardedRoute(c)
	if err != nil {
		return err
	}
	if route == nil {
		setIdentity(c.Response().Header(), "", "")
		return nil
	}
	if route.Fail != nil {
		return errRouteNotProxied
	}
	rt := s.guarded[route.Name]
	cfg := rt.cfg.Load()
	who, err := s.routeCaller(c, cfg)
	if err != nil {
		return err
	}
	if refusal := s.admitRoute(rt, cfg, who, c.RealIP(), now); refusal != nil {
		// Counted per minute and key by the recorder, as on a proxied
		// route, for a replay.
		s.d.Events.Record(detect.Event{Time: now, UserID: who.id.UserID, IP: c.RealIP(), Route: detect.RoutePrefix + rt.name,
			Layer: refusal.Layer, Outcome: detect.OutcomeLayerRefused})
		return s.routeRefusal(rt.layer, refusal)
	}
	s.d.Events.Record(detect.Event{Time: now, UserID: who.id.UserID, KeyID: who.id.KeyID, Plan: who.id.Plan, IP: c.RealIP(),
		Route: detect.RoutePrefix + rt.name, Outcome: outcomeChecked, Status: http.StatusOK})
	setIdentity(c.Response().Header(), who.id.UserID, who.id.Plan)
	return nil
}

// setIdentity sets the identity headers of an allowed check, empty when
// there is no user: Caddy 2.6's copy_headers copies a header the answer
// lacks as its own unreplaced placeholder text, an empty one as empty.
func setIdentity(h http.Header, user, plan string) {
	h.Set(headerUser, user)
	h.Set(headerPlan, plan)
}

// outcomeChecked is the outcome of a forward-auth check that let a
// request of a route pass; the app's answer is not known.
const outcomeChecked = "checked"

// hasIdentityHeader reports whether a checked request carries an
// X-Breakwater-* header. A proxy asks with the client's headers, and
// those names are Breakwater's: a client that sends one is refused, in
// case the proxy would pass it to the app.
func hasIdentityHeader(h http.Header) bool {
	for k := range h {
		if isBreakwaterHeader(k) {
			return true
		}
	}
	return false
}

// isBreakwaterHeader reports whether name is an X-Breakwater-* header in
// any case, '_' counted as '-': CGI, WSGI and Rack servers give the app
// X_Breakwater_User and X-Breakwater-User under one name
// (HTTP_X_BREAKWATER_USER), and some let the client's clobber the
// proxy's. Caddy and Traefik pass such a name on; nginx drops it.
func isBreakwaterHeader(name string) bool {
	return len(name) >= len(headerPrefix) &&
		strings.EqualFold(strings.ReplaceAll(name[:len(headerPrefix)], "_", "-"), headerPrefix)
}

// forwardedRoute is the route a forward-auth request asks about: by name,
// or by the original method and URI (nil: none, and the request passes).
// A URI that does not parse, a missing method or URI, or two header
// conventions that name different requests (a client can add the other
// proxy's headers) are refused.
func (s *Server) forwardedRoute(c echo.Context) (*routes.Config, error) {
	if name := c.Param("name"); name != "" {
		if route := s.allRoutes.Named(name); route != nil {
			return route, nil
		}
		return nil, errRouteNotFound
	}
	method, uri, err := forwardedRequest(c.Request().Header)
	if err != nil {
		return nil, err
	}
	p, err := routes.URIPath(uri)
	if err != nil {
		return nil, errBadForwardedURI
	}
	return s.allRoutes.Match(method, p), nil
}

// forwardedRequest reads the original method and URI from either
// convention; both present must agree.
func forwardedRequest(h http.Header) (method, uri string, err error) {
	fm, fu := h.Values(headerForwardedMethod), h.Values(headerForwardedURI)
	om, ou := h.Values(headerOriginalMethod), h.Values(headerOriginalURI)
	if len(fm) > 1 || len(fu) > 1 || len(om) > 1 || len(ou) > 1 {
		return "", "", errBadForwardedURI
	}
	method, uri = first(fm), first(fu)
	if m, u := first(om), first(ou); m != "" || u != "" {
		if (method != "" && method != m) || (uri != "" && uri != u) {
			return "", "", errBadForwardedURI
		}
		method, uri = m, u
	}
	if method == "" || uri == "" {
		return "", "", errBadForwardedURI
	}
	return method, uri, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
