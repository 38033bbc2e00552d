package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/server/edge"
	"breakwater/server/routes"
)

// Bounds of the fail limit's look at a request body: a "json:FIELD" key
// is read from at most maxFailPeek bytes (a longer body has no such
// field), and a key longer than maxFailKey is kept as its hash.
const (
	maxFailPeek = 64 << 10
	maxFailKey  = 256
)

// headerUser and headerPlan carry the identity of a user route to the app.
const (
	headerUser   = "X-Breakwater-User"
	headerPlan   = "X-Breakwater-Plan"
	headerPrefix = "X-Breakwater-"
)

// routeCall is one proxied request, as the proxy's hooks see it.
type routeCall struct {
	rt        *guardedRoute
	cfg       *routes.Config
	who       routeCaller
	path      string // the normalized path, as matched and as sent on
	requestID string
	unguarded bool             // a method no route of the path guards: not judged
	attempt   *limiter.Attempt // nil without a fail limit, or when it failed open
	status    int              // the app's own status
	failed    bool             // the app's answer counted as a failure
	started   []string         // keys whose cooldown this answer started
	err       error            // the upstream call failed
}

type routeCallKey struct{}

func callOf(ctx context.Context) *routeCall {
	call, _ := ctx.Value(routeCallKey{}).(*routeCall)
	return call
}

// handleRoute guards and proxies a request for one of the app's routes:
// the body limit, who asks (layer 0), the rate, burst and daily line, and
// the fail limit, all before anything reaches the app. It answers every
// path the public listener has no route of its own for, so that every
// spelling of a route's path is matched as the route (routes.Normalize);
// the app gets the normalized path, the one that was matched. A path
// that is a proxied route's but with a method none of them guards goes
// on to that route's app unguarded, with no identity and no event, as
// forward auth lets it pass; any other path is 404.
func (s *Server) handleRoute(c echo.Context) error {
	start := s.now()
	r := c.Request()
	c.SetPath("") // "unmatched" in metrics and logs, unless a route matches
	p, err := routes.Normalize(r.URL.EscapedPath())
	if err != nil {
		return echo.ErrNotFound
	}
	route := s.proxyRoutes.Match(r.Method, p)
	if route == nil {
		if route = s.proxyRoutes.MatchPath(p); route == nil {
			return echo.ErrNotFound
		}
		rt := s.guarded[route.Name]
		c.SetPath(route.Path)
		call := &routeCall{rt: rt, cfg: rt.cfg.Load(), path: p, requestID: requestID(c), unguarded: true}
		rt.proxy.ServeHTTP(c.Response(), r.WithContext(context.WithValue(r.Context(), routeCallKey{}, call)))
		return s.proxyResult(c, call)
	}
	c.SetPath(route.Path)
	rt := s.guarded[route.Name]
	cfg := rt.cfg.Load()
	if r.ContentLength > cfg.MaxBody {
		return errRouteTooLarge
	}
	if r.ContentLength < 0 {
		edge.CapBody(c, cfg.MaxBody)
	}
	who, err := s.routeCaller(c, cfg)
	if err != nil {
		return err
	}
	if refusal := s.admitRoute(rt, cfg, who, c.RealIP(), start); refusal != nil {
		// Counted per minute and key by the recorder, for a replay.
		s.d.Events.Record(detect.Event{Time: start, UserID: who.id.UserID, IP: c.RealIP(), Route: detect.RoutePrefix + rt.name,
			Layer: refusal.Layer, Outcome: detect.OutcomeLayerRefused})
		return s.routeRefusal(rt.layer, refusal)
	}
	call := &routeCall{rt: rt, cfg: cfg, who: who, path: p, requestID: requestID(c)}
	if rt.fails != nil {
		refused, err := s.beginFails(c, call, start)
		if refused || err != nil {
			return err
		}
		defer call.attempt.Cancel() // a no-op once the answer was judged
	}
	rt.proxy.ServeHTTP(c.Response(), r.WithContext(context.WithValue(r.Context(), routeCallKey{}, call)))
	s.recordRoute(c, call, start)
	return s.proxyResult(c, call)
}

// proxyResult maps a failed upstream call to its answer.
func (s *Server) proxyResult(c echo.Context, call *routeCall) error {
	if call.err == nil {
		return nil
	}
	call.attempt.Cancel()
	switch {
	case edge.IsTooLarge(call.err):
		return errRouteTooLarge
	case c.Request().Context().Err() != nil:
		return errClientGone
	}
	if ok, held := s.routeLog.Allow(s.now(), edge.RefusalLogInterval); ok {
		s.log.Warn("route upstream failed", "route", call.rt.name, "request_id", call.requestID, "err", call.err, "unlogged_since_last", held)
	}
	return errRouteUpstream
}

// beginFails checks and counts the request against the route's fail
// limit, per key of `by`, in one step. refused: the answer is written or
// returned as err.
func (s *Server) beginFails(c echo.Context, call *routeCall, now time.Time) (refused bool, err error) {
	keys, err := failKeys(c.Request(), call)
	if err != nil {
		return true, err
	}
	r, _ := s.checkFloods(call.rt.failsOpen, failScope(call.rt.layer), failSetKey(keys), now, func() (err error) {
		call.attempt, err = call.rt.fails.Begin(keys, now)
		return err
	})
	if r == nil || s.routeRefused(call.rt, call.cfg, r, call.who, c.RealIP(), now) == nil {
		return false, nil // passed, or shadow mode
	}
	s.d.Metrics.routeFailures.WithLabelValues(call.rt.name, r.Reason).Inc()
	if u := call.cfg.Fail.UniformStatus; u != 0 {
		s.edge.Refused(call.rt.layer, r.Reason) // answered here, not by the error handler
		writeUniform(c.Response(), u)
		return true, nil
	}
	return true, errTooManyFailures.WithRetryAfter(ceilSeconds(r.RetryAfter)).CountedAs(call.rt.layer, r.Reason)
}

// failKeys are the fail limit's keys of a request: "ip:ADDRESS" and
// "json:FIELD:value", each value trimmed and lower-cased. A field that is
// absent, not a string, or in a body too long to look at has the value "".
func failKeys(r *http.Request, call *routeCall) ([]string, error) {
	var fields map[string]json.RawMessage
	peeked := false
	out := make([]string, 0, len(call.cfg.Fail.By))
	for _, by := range call.cfg.Fail.By {
		field, isJSON := strings.CutPrefix(by, "json:")
		if !isJSON {
			out = append(out, "ip:"+call.who.ip)
			continue
		}
		if !peeked {
			var err error
			if fields, err = peekJSON(r); err != nil {
				return nil, err
			}
			peeked = true
		}
		var v string
		_ = json.Unmarshal(fields[field], &v)
		v = strings.ToLower(strings.TrimSpace(v))
		if len(v) > maxFailKey {
			sum := sha256.Sum256([]byte(v))
			v = "sha256:" + hex.EncodeToString(sum[:])
		}
		out = append(out, by+":"+v)
	}
	return out, nil
}

// peekJSON reads the top-level fields of a JSON body from a bounded copy
// of its start, and puts the bytes back for the app.
func peekJSON(r *http.Request) (map[string]json.RawMessage, error) {
	buf, err := io.ReadAll(io.LimitReader(r.Body, maxFailPeek+1))
	if err != nil {
		if edge.IsTooLarge(err) {
			return nil, errRouteTooLarge
		}
		return nil, edge.ErrBadBody
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
	if len(buf) > maxFailPeek {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(buf, &fields) != nil {
		return nil, nil
	}
	return fields, nil
}

// newProxy is the reverse proxy to one route's upstream, streaming both
// ways.
func (s *Server) newProxy(target *url.URL) *httputil.ReverseProxy {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DialContext = (&net.Dialer{Timeout: routeDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	transport.ResponseHeaderTimeout = routeHeaderTimeout
	return &httputil.ReverseProxy{
		Rewrite:        func(pr *httputil.ProxyRequest) { s.rewrite(pr, target) },
		Transport:      transport,
		FlushInterval:  -1, // pass streamed answers on as they come
		ModifyResponse: s.judge,
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, err error) {
			if call := callOf(r.Context()); call != nil {
				call.err = err // answered by proxyResult
			}
		},
	}
}

// rewrite is the request the app gets: the normalized path (the one
// matched), no X-Breakwater-* header of the client's, the identity of a
// user route, X-Forwarded-For with the peer appended (to the chain a
// trusted proxy sent, never an untrusted client's), X-Forwarded-Proto and
// -Host, and the request id. Authorization passes unchanged.
func (s *Server) rewrite(pr *httputil.ProxyRequest, target *url.URL) {
	call := callOf(pr.In.Context())
	if call != nil {
		pr.Out.URL.Path, pr.Out.URL.RawPath = call.path, ""
	}
	pr.SetURL(target)
	h := pr.Out.Header
	for k := range h {
		if isBreakwaterHeader(k) {
			delete(h, k)
		}
	}
	if call != nil && call.who.id.UserID != "" {
		h.Set(headerUser, call.who.id.UserID)
		h.Set(headerPlan, call.who.id.Plan)
	}
	in := pr.In
	chain, trusted := s.edge.ForwardedFor(in)
	proto, host := "http", in.Host
	if in.TLS != nil {
		proto = "https"
	}
	if trusted {
		if v := in.Header.Get("X-Forwarded-Proto"); v != "" {
			proto = v
		}
		if v := in.Header.Get("X-Forwarded-Host"); v != "" {
			host = v
		}
	} else {
		h.Del(edge.HeaderRealIP)
		h.Del("Forwarded")
	}
	h.Set(edge.HeaderXFF, strings.Join(chain, ", "))
	h.Set("X-Forwarded-Proto", proto)
	h.Set("X-Forwarded-Host", host)
	if call != nil {
		h.Set(echo.HeaderXRequestID, call.requestID)
	}
}

// judge reads the app's answer for the fail limit: a status in `statuses`
// is a failure on every key, any 2xx a success, anything else neither.
// With uniform_status (and the route enforcing), a counted failure is
// answered with the same status, headers and body as a cooldown refusal.
func (s *Server) judge(resp *http.Response) error {
	call := callOf(resp.Request.Context())
	if call == nil || call.unguarded {
		return nil
	}
	call.status = resp.StatusCode
	if call.attempt == nil {
		return nil
	}
	f, now := call.cfg.Fail, s.now()
	switch {
	case slices.Contains(f.Statuses, resp.StatusCode):
		call.failed = true
		call.attempt.Fail(now)
		call.started = call.attempt.CooldownsStarted()
		s.d.Metrics.routeFailures.WithLabelValues(call.rt.name, strconv.Itoa(resp.StatusCode)).Inc()
		if f.UniformStatus != 0 && call.cfg.Mode != routes.ModeShadow {
			uniformResponse(resp, f.UniformStatus)
		}
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		call.attempt.Succeed(now)
	default:
		call.attempt.Neutral()
	}
	return nil
}

// uniformResponse replaces the app's answer with the uniform one.
func uniformResponse(resp *http.Response, status int) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxFailPeek))
	_ = resp.Body.Close()
	body := uniformBody(status)
	resp.StatusCode, resp.Status = status, strconv.Itoa(status)+" "+http.StatusText(status)
	resp.Header = uniformHeader(len(body))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength, resp.TransferEncoding, resp.Trailer = int64(len(body)), nil, nil
}

// writeUniform answers a fail-limit refusal with the uniform answer.
func writeUniform(w http.ResponseWriter, status int) {
	body := uniformBody(status)
	for k, v := range uniformHeader(len(body)) {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func uniformHeader(n int) http.Header {
	return http.Header{
		echo.HeaderContentType:   {"application/problem+json"},
		"Cache-Control":          {"no-store"},
		echo.HeaderContentLength: {strconv.Itoa(n)},
	}
}

func uniformBody(status int) []byte {
	b, _ := json.Marshal(uniformProblem(status))
	return append(b, '\n')
}

// recordRoute records a request that reached the app as a statistics
// event (Route "route:NAME"), and each cooldown it started. Refusals are
// counted in metrics, not stored one by one: anyone can send them
// without end.
func (s *Server) recordRoute(c echo.Context, call *routeCall, start time.Time) {
	outcome := "other"
	switch {
	case call.err != nil:
		outcome = "upstream_failed"
	case call.failed:
		outcome = "failure"
	case call.status >= 200 && call.status < 300:
		outcome = "ok"
	}
	route := detect.RoutePrefix + call.rt.name
	ip := c.RealIP()
	s.d.Events.Record(detect.Event{
		Time: start, UserID: call.who.id.UserID, KeyID: call.who.id.KeyID, Plan: call.who.id.Plan, IP: ip,
		Route: route, Outcome: outcome, Status: call.status, Bytes: max(c.Request().ContentLength, 0),
		LatencyMS: s.now().Sub(start).Milliseconds(),
	})
	for range call.started {
		s.d.Events.Record(detect.Event{Time: start, UserID: call.who.id.UserID, IP: ip, Route: route, Outcome: detect.OutcomeCooldownStarted})
	}
	if call.failed {
		if ok, held := s.routeLog.Allow(start, edge.RefusalLogInterval); ok {
			s.log.Info("route failure counted", "route", call.rt.name, "status", call.status, "cooldowns_started", len(call.started),
				"request_id", call.requestID, "unlogged_since_last", held)
		}
	}
}
