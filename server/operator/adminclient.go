package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"breakwater/storage"
)

// AdminClient calls a running server's admin API: it is how the CLI manages
// keys while the server holds the database open. It implements Service,
// as Operator does on the database itself.
type AdminClient struct {
	addr  string
	base  string
	token string
	hc    *http.Client
}

// ErrTokenRefused is the admin API's 401: the token the CLI sent is not
// the server's.
var ErrTokenRefused = errors.New("operator: the admin token was refused")

// NewAdminClient talks to the admin API at addr (host:port) with token.
func NewAdminClient(addr, token string) *AdminClient {
	return &AdminClient{addr: addr, base: "http://" + addr, token: token, hc: &http.Client{Timeout: 30 * time.Second}}
}

// refused is the error of a 401 answer: the token, not the command, is
// wrong, and the operator must know which server refused it.
func (a *AdminClient) refused() error {
	return fmt.Errorf("your BREAKWATER_ADMIN_TOKEN was refused by the server at %s: set the token that server runs with: %w", a.addr, ErrTokenRefused)
}

// CreateKey asks the server for a new key.
func (a *AdminClient) CreateKey(ctx context.Context, user, plan string) (secret string, info KeyInfo, err error) {
	var out CreateKeyResponse
	if err := a.call(ctx, http.MethodPost, "/api/keys", CreateKeyRequest{User: user, Plan: plan}, &out); err != nil {
		return "", KeyInfo{}, err
	}
	return out.Key, out.KeyInfo, nil
}

// ListKeys lists every key without secrets.
func (a *AdminClient) ListKeys(ctx context.Context) ([]KeyInfo, error) {
	var out []KeyInfo
	err := a.call(ctx, http.MethodGet, "/api/keys", nil, &out)
	return out, err
}

// RevokeKey disables a key on the running server.
func (a *AdminClient) RevokeKey(ctx context.Context, id string) (KeyInfo, error) {
	var out KeyInfo
	err := a.call(ctx, http.MethodPost, "/api/keys/"+url.PathEscape(id)+"/revoke", nil, &out)
	return out, err
}

func (a *AdminClient) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return a.refused()
	}
	if resp.StatusCode >= 300 {
		var p problem
		if json.Unmarshal(data, &p) == nil && p.Code != "" {
			if p.Status == http.StatusNotFound && p.Code == "not_found" {
				return fmt.Errorf("%s: %w", p.Detail, storage.ErrNotFound)
			}
			return errors.New(p.Detail)
		}
		return fmt.Errorf("admin API at %s: %s", a.base, resp.Status)
	}
	return json.Unmarshal(data, out)
}

// SetBanned bans or unbans a user on the running server.
func (a *AdminClient) SetBanned(ctx context.Context, user string, banned, create bool) (UserInfo, error) {
	var out UserInfo
	err := a.call(ctx, http.MethodPost, "/api/users/"+url.PathEscape(user), UserRequest{Banned: &banned, Create: create}, &out)
	return out, err
}

// SetPlan moves a user to another plan on the running server.
func (a *AdminClient) SetPlan(ctx context.Context, user, plan string) (UserInfo, error) {
	var out UserInfo
	err := a.call(ctx, http.MethodPost, "/api/users/"+url.PathEscape(user), UserRequest{Plan: plan}, &out)
	return out, err
}

// Usage reports usage for one user, or for all with user "".
func (a *AdminClient) Usage(ctx context.Context, user string) ([]UsageInfo, error) {
	var out []UsageInfo
	err := a.call(ctx, http.MethodGet, "/api/usage?user="+url.QueryEscape(user), nil, &out)
	return out, err
}

// Budget reports the global budget.
func (a *AdminClient) Budget(ctx context.Context) (BudgetInfo, error) {
	var out BudgetInfo
	err := a.call(ctx, http.MethodGet, "/api/budget", nil, &out)
	return out, err
}

// SetBrake engages or releases the manual kill switch.
func (a *AdminClient) SetBrake(ctx context.Context, on bool) (BudgetInfo, error) {
	var out BudgetInfo
	err := a.call(ctx, http.MethodPost, "/api/brake", BrakeRequest{On: &on}, &out)
	return out, err
}

// Backup streams a consistent copy of the running server's database to w.
// target, where the copy goes, lets the server refuse its own file.
func (a *AdminClient) Backup(ctx context.Context, w io.Writer, target string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/api/backup?target="+url.QueryEscape(target), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	hc := *a.hc
	hc.Timeout = 0 // a large database takes its time; ctx bounds it
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		return a.refused()
	}
	if resp.StatusCode == http.StatusConflict {
		return fmt.Errorf("backup: %s is the live database of the running server; write the copy elsewhere: %w", target, ErrBackupOntoDatabase)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("admin API at %s: backup: %s", a.base, resp.Status)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("backup download: %w", err)
	}
	return nil
}

// CreateInvite asks the server for a new invite code.
func (a *AdminClient) CreateInvite(ctx context.Context, uses int, ttl time.Duration, note string) (code string, info InviteInfo, err error) {
	var out CreateInviteResponse
	req := CreateInviteRequest{Uses: uses, Expires: ttl.String(), Note: note}
	if err := a.call(ctx, http.MethodPost, "/api/invites", req, &out); err != nil {
		return "", InviteInfo{}, err
	}
	return out.Code, out.InviteInfo, nil
}

// ListInvites lists every invite without codes.
func (a *AdminClient) ListInvites(ctx context.Context) ([]InviteInfo, error) {
	var out []InviteInfo
	err := a.call(ctx, http.MethodGet, "/api/invites", nil, &out)
	return out, err
}

// DeleteInvite removes an invite and its redemptions on the running server.
func (a *AdminClient) DeleteInvite(ctx context.Context, id string) (InviteInfo, error) {
	var out InviteInfo
	err := a.call(ctx, http.MethodDelete, "/api/invites/"+url.PathEscape(id), nil, &out)
	return out, err
}

// RevokeInvite disables an invite on the running server.
func (a *AdminClient) RevokeInvite(ctx context.Context, id string) (InviteInfo, error) {
	var out InviteInfo
	err := a.call(ctx, http.MethodPost, "/api/invites/"+url.PathEscape(id)+"/revoke", nil, &out)
	return out, err
}
