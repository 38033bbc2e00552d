package server

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/server/routes"
)

// The headers a proxy names the original request in: Caddy and Traefik
// send X-Forwarded-Method and X-Forwarded-Uri, nginx (as the README's
// snippet sets them) X-Original-Method and X-Original-URI.
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
	p := toProblem(err)
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
// identity headers are set.
func (s *Server) forwardAuth(c echo.Context, now time.Time) error {
	r := c.Request()
	if peer := parseAddr(r.RemoteAddr); !peer.IsValid() || !s.clients.isTrusted(peer) {
		return errUntrustedProxy
	}
	route, err := s.forwardedRoute(c)
	if err != nil {
		return err
	}
	rt := s.guarded[route.Name]
	cfg := rt.cfg.Load()
	who, err := s.routeCaller(c, cfg)
	if err != nil {
		return err
	}
	if refusal := s.admitRoute(rt, cfg, who.key, now); refusal != nil {
		return s.routeRefusal(rt.layer, refusal)
	}
	h := c.Response().Header()
	h.Set(headerUser, who.id.UserID)
	h.Set(headerPlan, who.id.Plan)
	return nil
}

// forwardedRoute is the route a forward-auth request asks about: by name,
// or by the original method and URI. Deny by default: a URI that matches
// no route, does not parse, or that the two header conventions name
// differently (a client can add the other proxy's headers) is refused.
func (s *Server) forwardedRoute(c echo.Context) (*routes.Config, error) {
	if name := c.Param("name"); name != "" {
		if route := s.allRoutes.Named(name); route != nil {
			return route, nil
		}
		return nil, errRouteNotFound
	}
	h := c.Request().Header
	method, uri, err := forwardedRequest(h)
	if err != nil {
		return nil, err
	}
	p, ok := uriPath(uri)
	if !ok {
		return nil, errBadForwardedURI
	}
	route := s.allRoutes.Match(method, p)
	if route == nil {
		return nil, errNoRoute
	}
	return route, nil
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
		return "", "", errNoRoute
	}
	return strings.ToUpper(method), uri, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// uriPath is the cleaned path of a request URI ("/a/../b?q" is "/b"), so
// that no encoding or dot segment slips a request past the route it is
// for; false if it does not parse as an origin-form URI.
func uriPath(uri string) (string, bool) {
	if !strings.HasPrefix(uri, "/") {
		return "", false
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil || u.Host != "" {
		return "", false
	}
	return cleanPath(u.Path)
}
