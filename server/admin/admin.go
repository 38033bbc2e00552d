package admin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"breakwater/server/edge"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/server/operator"
)

// adminOnly lets a request through only with the admin token, sent as
// "Authorization: Bearer TOKEN" (the CLI, scripts) or as the password of
// HTTP Basic authentication (a browser opening the dashboard; any user
// name). Both sides are hashed first so the comparison takes the same time
// whatever their lengths. With no token configured, nothing gets through.
func (s *Server) adminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	want := sha256.Sum256([]byte(s.d.AdminToken))
	return func(c echo.Context) error {
		token, ok := edge.Bearer(c.Request().Header.Get(echo.HeaderAuthorization))
		if !ok {
			_, token, ok = c.Request().BasicAuth()
		}
		got := sha256.Sum256([]byte(token))
		if !ok || s.d.AdminToken == "" || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			c.Response().Header().Set("WWW-Authenticate", `Basic realm="breakwater admin", charset="UTF-8"`)
			return errAdminUnauthorized
		}
		// A CLI names the database its config means; another instance's
		// CLI must not act on this one's (a caller that names none, a
		// script or a browser, is not checked).
		if meant := c.Request().Header.Get(operator.DatabaseHeader); meant != "" && !s.d.Operator.IsDatabase(meant) {
			held := s.d.Operator.Database()
			c.Response().Header().Set(operator.DatabaseHeader, held)
			return wrongDatabase(held, meant)
		}
		return next(c)
	}
}

// sameOriginWrites refuses, before the admin token is even looked at, a
// request that changes state (any method but GET, HEAD and OPTIONS) when
// a browser made it for a page of another origin: a browser that holds
// the admin token as the dashboard's Basic credentials sends them with a
// form or a fetch of any site the operator opens. The dashboard's own
// forms, the CLI and scripts pass; see crossOrigin. A reading request
// that another site's page embeds or fetches is refused too (see
// embeddedByOtherSite): it changes nothing, but /api/backup and
// /api/recorded cost the server a whole database or days of events each,
// and a page can ask for them a hundred times at once with the
// operator's credentials.
func (s *Server) sameOriginWrites(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			if !embeddedByOtherSite(r) {
				return next(c)
			}
		}
		if crossOrigin(r) {
			s.log.Warn("admin request from another origin refused", "method", r.Method, "path", r.URL.Path,
				"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
			return errCrossOrigin
		}
		return next(c)
	}
}

// embeddedByOtherSite reports whether a browser made r for a page of
// another site (Sec-Fetch-Site "cross-site" or "same-site", another port
// of the host included) other than by opening it as a page of its own:
// an image, a script, a frame, a fetch. Following a link to the dashboard
// or an admin address (Sec-Fetch-Mode "navigate", Sec-Fetch-Dest
// "document") passes, as do requests without these headers.
func embeddedByOtherSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return r.Header.Get("Sec-Fetch-Mode") != "navigate" || r.Header.Get("Sec-Fetch-Dest") != "document"
	}
	return false
}

// crossOrigin reports whether a browser made r for a page of another
// origin. Sec-Fetch-Site, which a page cannot set, decides when present:
// "same-origin" (the dashboard's forms) and "none" (the operator typed
// the address) pass; "same-site" (another port of the same host) and
// "cross-site" do not. Without it, an Origin header must name this host;
// "null" (a sandboxed page, a data: URL) does not. A request with neither
// is no browser's (the CLI, curl, a script) and passes: it needs the
// admin token all the same.
func crossOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return false
	case "":
	default:
		return true
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return true
	}
	return !strings.EqualFold(u.Host, r.Host)
}

func (s *Server) handleCreateKey(c echo.Context) error {
	var req operator.CreateKeyRequest
	if err := bindBody(c, &req, `Send JSON {"user":"...","plan":"..."}.`); err != nil {
		return err
	}
	secret, info, err := s.d.Operator.CreateKey(c.Request().Context(), req.User, req.Plan)
	if err != nil {
		return err
	}
	s.log.Info("api key created", "key_id", info.ID, "user", info.UserID, "plan", info.Plan)
	return c.JSON(http.StatusCreated, operator.CreateKeyResponse{KeyInfo: info, Key: secret})
}

func (s *Server) handleListKeys(c echo.Context) error {
	list, err := s.d.Operator.ListKeys(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, list)
}

func (s *Server) handleRevokeKey(c echo.Context) error {
	info, err := s.d.Operator.RevokeKey(c.Request().Context(), pathParam(c, "id"))
	switch {
	case errors.Is(err, keys.ErrNotFound):
		return errKeyNotFound
	case err != nil:
		return err
	}
	s.log.Info("api key revoked", "key_id", info.ID, "user", info.UserID)
	return c.JSON(http.StatusOK, info)
}

// handleUpdateUser bans, unbans or moves a user to another plan.
func (s *Server) handleUpdateUser(c echo.Context) error {
	var req operator.UserRequest
	const hint = `Send JSON {"banned":true|false} or {"plan":"NAME"}.`
	if err := bindBody(c, &req, hint); err != nil {
		return err
	}
	if req.Banned == nil && req.Plan == "" {
		return edge.BadRequest(hint)
	}
	ctx, user := c.Request().Context(), pathParam(c, "id")
	var info operator.UserInfo
	var err error
	if req.Banned != nil {
		info, err = s.d.Operator.SetBanned(ctx, user, *req.Banned, req.Create)
	}
	if err == nil && req.Plan != "" {
		info, err = s.d.Operator.SetPlan(ctx, user, req.Plan)
	}
	switch {
	case errors.Is(err, keys.ErrNotFound):
		return errUserNotFound
	case err != nil:
		return err
	}
	s.log.Info("user changed", "user", info.ID, "plan", info.Plan, "banned", info.Banned)
	return c.JSON(http.StatusOK, info)
}

func (s *Server) handleUsage(c echo.Context) error {
	list, err := s.d.Operator.Usage(c.Request().Context(), c.QueryParam("user"))
	switch {
	case errors.Is(err, keys.ErrNotFound):
		return errUserNotFound
	case err != nil:
		return err
	}
	return c.JSON(http.StatusOK, list)
}

// errBadRange refuses a statistics range that is not two RFC 3339 times
// in order.
var errBadRange = edge.BadRequest("Send from and to as RFC 3339 times, from before to.")

// handleRecorded streams the statistics events and findings of [from,
// to) (RFC 3339 times), for replay and thresholds while serving, in the
// frames of operator.RecordedContentType: each event is written as it is
// read from the store a page at a time, so a range of millions of events
// takes the memory of a page and a buffer on this side, and the reader's
// on the other. Each full buffer written pushes the write deadline on: a
// reader that keeps reading gets the whole range, one that stalls is cut
// off.
func (s *Server) handleRecorded(c echo.Context) error {
	from, err1 := time.Parse(time.RFC3339Nano, c.QueryParam("from"))
	to, err2 := time.Parse(time.RFC3339Nano, c.QueryParam("to"))
	if err1 != nil || err2 != nil || !from.Before(to) {
		return errBadRange
	}
	ctx := c.Request().Context()
	c.Response().Header().Set(echo.HeaderContentType, operator.RecordedContentType)
	c.Response().WriteHeader(http.StatusOK)
	sw := &streamWriter{w: c.Response(), rc: http.NewResponseController(c.Response()), now: s.wallClock}
	w := operator.NewRecordedWriter(bufio.NewWriterSize(sw, 64<<10))
	findings, err := s.d.Operator.EachRecorded(ctx, from, to, w.Event)
	for i := 0; err == nil && i < len(findings); i++ {
		err = w.Finding(findings[i])
	}
	events, _ := w.Counts()
	switch {
	case err == nil:
		err = w.End()
	case ctx.Err() != nil || errors.Is(err, errWrite):
		// The reader went away: nobody to tell.
	default:
		// Too late for a problem answer: the last frame says why the
		// answer stops here, and it has no end frame.
		s.log.Error("recorded events", "events", events, "err", err)
		err = w.Fail("reading the statistics failed; see the server's log")
	}
	if err != nil {
		s.log.Warn("recorded events: the reader went away", "events", events, "err", err)
	}
	return nil
}

// errWrite marks a failed write of a streamed answer: the reader went
// away or stalled past the deadline.
var errWrite = errors.New("server: write of a streamed answer")

// streamWriter writes a streamed answer, moving its write deadline
// edge.WriteTimeout past each write.
type streamWriter struct {
	w   io.Writer
	rc  *http.ResponseController
	now func() time.Time
}

func (d *streamWriter) Write(p []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(d.now().Add(edge.WriteTimeout)) // not every writer has one
	n, err := d.w.Write(p)
	if err != nil {
		return n, fmt.Errorf("%w: %w", errWrite, err)
	}
	return n, nil
}

func (s *Server) handleBudget(c echo.Context) error {
	info, err := s.d.Operator.Budget(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, info)
}

// handleLedger answers the ledger of the days from..to (YYYY-MM-DD), for
// reconcile while serving.
func (s *Server) handleLedger(c echo.Context) error {
	from, to := c.QueryParam("from"), c.QueryParam("to")
	if operator.CheckDays(from, to) != nil {
		return errBadDays
	}
	l, err := s.d.Operator.Ledger(c.Request().Context(), from, to)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, l)
}

// errBadDays refuses a span of days that Ledger does not read.
var errBadDays = edge.BadRequest("Send from and to as days YYYY-MM-DD, from not after to, at most a year apart.")

func (s *Server) handleBrake(c echo.Context) error {
	var req operator.BrakeRequest
	const hint = `Send JSON {"on":true} or {"on":false}.`
	if err := bindBody(c, &req, hint); err != nil {
		return err
	}
	if req.On == nil {
		return edge.BadRequest(hint)
	}
	info, err := s.d.Operator.SetBrake(c.Request().Context(), *req.On)
	if err != nil {
		return err
	}
	s.log.Warn("manual brake set by the operator", "on", *req.On)
	return c.JSON(http.StatusOK, info)
}

// handleBackup streams a consistent copy of the database. The query
// parameter target, where the client will write the copy, is refused if it
// is the database file itself (the CLI sends it: the server knows its own
// file, whatever the CLI's config says).
func (s *Server) handleBackup(c echo.Context) error {
	if err := s.d.Operator.CheckBackupTarget(c.QueryParam("target")); err != nil {
		s.log.Warn("backup onto the live database refused", "target", c.QueryParam("target"))
		return errBackupOntoDatabase
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "application/octet-stream")
	h.Set(echo.HeaderContentDisposition, `attachment; filename="breakwater.db"`)
	c.Response().WriteHeader(http.StatusOK)
	if err := s.d.Operator.Backup(c.Request().Context(), c.Response(), ""); err != nil {
		// Too late for a problem answer: the copy is cut short, and the
		// client sees a short body and no valid database.
		s.log.Error("backup interrupted", "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) handleCreateInvite(c echo.Context) error {
	var req operator.CreateInviteRequest
	if err := bindBody(c, &req, `Send JSON {"uses":1,"expires":"72h","note":"..."}.`); err != nil {
		return err
	}
	var ttl time.Duration
	if req.Expires != "" {
		d, err := time.ParseDuration(req.Expires)
		if err != nil {
			return edge.BadRequest("expires must be a duration such as \"72h\".")
		}
		ttl = d
	}
	code, info, err := s.d.Operator.CreateInvite(c.Request().Context(), req.Uses, ttl, req.Note)
	if err != nil {
		return err
	}
	s.log.Info("invite created", "invite_id", info.ID, "uses", info.MaxUses, "expires_at", info.ExpiresAt)
	return c.JSON(http.StatusCreated, operator.CreateInviteResponse{InviteInfo: info, Code: code})
}

func (s *Server) handleListInvites(c echo.Context) error {
	list, err := s.d.Operator.ListInvites(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, list)
}

func (s *Server) handleRevokeInvite(c echo.Context) error {
	return s.inviteAction(c, "invite revoked", s.d.Operator.RevokeInvite)
}

func (s *Server) handleDeleteInvite(c echo.Context) error {
	return s.inviteAction(c, "invite deleted", s.d.Operator.DeleteInvite)
}

// inviteAction applies act to the invite named in the path, logs done and
// answers the invite as it was left.
func (s *Server) inviteAction(c echo.Context, done string, act func(context.Context, string) (operator.InviteInfo, error)) error {
	info, err := act(c.Request().Context(), pathParam(c, "id"))
	switch {
	case errors.Is(err, invites.ErrNotFound):
		return errInviteNotFound
	case err != nil:
		return err
	}
	s.log.Info(done, "invite_id", info.ID)
	return c.JSON(http.StatusOK, info)
}

// errBodyNotUTF8 refuses an admin API body that is not valid UTF-8.
var errBodyNotUTF8 = edge.BadRequest("The body is not valid UTF-8: send JSON in UTF-8.")

// bindBody reads an admin API body into v as c.Bind does, answering
// edge.BadRequest(hint) for one that does not bind. A body that is not valid
// UTF-8 is refused first (errBodyNotUTF8): the JSON decoder would read
// each bad byte as U+FFFD, so that an id of such bytes would name another
// id, and two of them one. The body is held to its route's limit
// (edge.LimitBody) before it gets here.
func bindBody(c echo.Context, v any, hint string) error {
	r := c.Request()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return edge.BadRequest(hint)
	}
	if !utf8.Valid(body) {
		return errBodyNotUTF8
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err := c.Bind(v); err != nil {
		return edge.BadRequest(hint)
	}
	return nil
}

// pathParam is a path parameter, unescaped once. Echo routes on the
// path as sent (URL.RawPath) when it holds an escape that the decoded
// path cannot show, such as %2F, and leaves its parameters escaped: a
// user id holding a "/" would otherwise name another user. Else it routes
// on the decoded path, whose parameters are not unescaped again: an id
// sent as %2500 is "%00", not a NUL.
func pathParam(c echo.Context, name string) string {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v
	}
	if u, err := url.PathUnescape(v); err == nil {
		return u
	}
	return v
}

func (s *Server) handleCooldowns(c echo.Context) error {
	list, err := s.d.Operator.Cooldowns(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, list)
}

// handleClearCooldown lifts one cooldown; the key and its source (empty:
// the invite limits) are in the body, as they hold ":" and "/".
func (s *Server) handleClearCooldown(c echo.Context) error {
	var req operator.ClearCooldownRequest
	const hint = `Send JSON {"key":"email:ann@example.com"} (the invite guard) or {"source":"route:NAME","key":"ip:203.0.113.7"}.`
	if err := bindBody(c, &req, hint); err != nil {
		return err
	}
	if req.Key == "" {
		return edge.BadRequest(hint)
	}
	info, err := s.d.Operator.ClearCooldown(c.Request().Context(), req.Source, req.Key)
	switch {
	case errors.Is(err, operator.ErrNoCooldown):
		return errNoCooldown
	case err != nil:
		return err
	}
	s.log.Warn("cooldown cleared by the operator", "source", info.Source, "key", info.Key, "until", info.Until)
	return c.JSON(http.StatusOK, info)
}
