package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/storage"
)

var errKeyNotFound = problem(http.StatusNotFound, "not_found", "Not found", "No key has that id.")

// adminOnly lets a request through only with the admin token. Both sides
// are hashed first so the comparison takes the same time whatever their
// lengths. With no token configured, nothing gets through.
func (s *Server) adminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	want := sha256.Sum256([]byte(s.d.AdminToken))
	return func(c echo.Context) error {
		token, ok := bearer(c.Request().Header.Get(echo.HeaderAuthorization))
		got := sha256.Sum256([]byte(token))
		if !ok || s.d.AdminToken == "" || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			return problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
				"The admin API needs Authorization: Bearer $BREAKWATER_ADMIN_TOKEN.")
		}
		return next(c)
	}
}

// createKeyRequest is the body of POST /api/keys.
type createKeyRequest struct {
	User string `json:"user"`
	Plan string `json:"plan"`
}

// createKeyResponse is the answer: the key's description and, this once,
// its secret.
type createKeyResponse struct {
	KeyInfo
	Key string `json:"key"`
}

func (s *Server) handleCreateKey(c echo.Context) error {
	var req createKeyRequest
	if err := c.Bind(&req); err != nil {
		return problem(http.StatusBadRequest, "bad_request", "Bad request", `Send JSON {"user":"...","plan":"..."}.`)
	}
	secret, info, err := s.d.Keys.Create(req.User, req.Plan)
	switch {
	case errors.Is(err, ErrBadUserID), errors.Is(err, ErrUnknownPlan):
		return problem(http.StatusBadRequest, "bad_request", "Bad request", err.Error())
	case err != nil:
		return err
	}
	s.log.Info("api key created", "key_id", info.ID, "user", info.UserID, "plan", info.Plan)
	return c.JSON(http.StatusCreated, createKeyResponse{KeyInfo: info, Key: secret})
}

func (s *Server) handleListKeys(c echo.Context) error {
	return c.JSON(http.StatusOK, s.d.Keys.List())
}

func (s *Server) handleRevokeKey(c echo.Context) error {
	info, err := s.d.Keys.Revoke(c.Param("id"))
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return errKeyNotFound
	case err != nil:
		return err
	}
	s.log.Info("api key revoked", "key_id", info.ID, "user", info.UserID)
	return c.JSON(http.StatusOK, info)
}

var errInviteNotFound = problem(http.StatusNotFound, "not_found", "Not found", "No invite has that id.")

// createInviteRequest is the body of POST /api/invites.
type createInviteRequest struct {
	Uses int `json:"uses"`
	// Expires is a Go duration such as "72h"; "" or "0" means never.
	Expires string `json:"expires"`
	Note    string `json:"note"`
}

// createInviteResponse is the answer: the invite and, this once, its code.
type createInviteResponse struct {
	InviteInfo
	Code string `json:"code"`
}

func (s *Server) handleCreateInvite(c echo.Context) error {
	var req createInviteRequest
	if err := c.Bind(&req); err != nil {
		return problem(http.StatusBadRequest, "bad_request", "Bad request", `Send JSON {"uses":1,"expires":"72h","note":"..."}.`)
	}
	var ttl time.Duration
	if req.Expires != "" {
		d, err := time.ParseDuration(req.Expires)
		if err != nil {
			return problem(http.StatusBadRequest, "bad_request", "Bad request", "expires must be a duration such as \"72h\".")
		}
		ttl = d
	}
	code, info, err := s.d.Invites.Create(req.Uses, ttl, req.Note)
	switch {
	case errors.Is(err, ErrBadInvite):
		return problem(http.StatusBadRequest, "bad_request", "Bad request", err.Error())
	case err != nil:
		return err
	}
	s.log.Info("invite created", "invite_id", info.ID, "uses", info.MaxUses, "expires_at", info.ExpiresAt)
	return c.JSON(http.StatusCreated, createInviteResponse{InviteInfo: info, Code: code})
}

func (s *Server) handleListInvites(c echo.Context) error {
	list, err := s.d.Invites.List()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, list)
}

func (s *Server) handleRevokeInvite(c echo.Context) error {
	info, err := s.d.Invites.Revoke(c.Param("id"))
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return errInviteNotFound
	case err != nil:
		return err
	}
	s.log.Info("invite revoked", "invite_id", info.ID)
	return c.JSON(http.StatusOK, info)
}
