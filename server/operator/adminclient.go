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
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"breakwater/server/invites"
	"breakwater/server/keys"
)

// AdminClient calls a running server's admin API: it is how the CLI manages
// keys while the server holds the database open. It implements Service,
// as Operator does on the database itself.
type AdminClient struct {
	addr     string
	base     string
	token    string
	database string // sent as DatabaseHeader; "" sends none
	hc       *http.Client
}

// DatabaseHeader carries, on each admin API call, the absolute path of the
// database the CLI's config names. The server refuses a call meant for
// another database with 409 wrong_database and its own path in this same
// header, so a second instance on the machine can never answer for the
// first.
const DatabaseHeader = "X-Breakwater-Database"

// ErrWrongDatabase is the admin API's 409 wrong_database: the server at
// the admin address holds another database than the one the CLI meant.
var ErrWrongDatabase = errors.New("operator: the server holds another database")

// ErrTokenRefused is the admin API's 401: the token the CLI sent is not
// the server's.
var ErrTokenRefused = errors.New("operator: the admin token was refused")

// NewAdminClient talks to the admin API at addr (host:port) with token.
func NewAdminClient(addr, token string) *AdminClient {
	return &AdminClient{addr: addr, base: "http://" + addr, token: token, hc: &http.Client{Timeout: 30 * time.Second}}
}

// ForDatabase makes every call name path, the database the caller means
// (see DatabaseHeader), and returns a.
func (a *AdminClient) ForDatabase(path string) *AdminClient {
	a.database = path
	return a
}

// newRequest is a request to the admin API with the token and the
// database it is meant for.
func (a *AdminClient) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if a.database != "" {
		req.Header.Set(DatabaseHeader, a.database)
	}
	return req, nil
}

// refusal is the error of an answer that refuses the caller rather than
// the command: a wrong token (401), another database (409
// wrong_database); nil for any other answer.
func (a *AdminClient) refusal(resp *http.Response, p problem) error {
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return a.refused()
	case resp.StatusCode == http.StatusConflict && p.Code == "wrong_database":
		return fmt.Errorf("the server at %s holds %s, not %s: check server.admin_listen and storage.path: %w",
			a.addr, resp.Header.Get(DatabaseHeader), a.database, ErrWrongDatabase)
	}
	return nil
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
	return out, notFoundAs(err, keys.ErrNotFound)
}

func (a *AdminClient) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		if err := sendable(in); err != nil {
			return err
		}
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := a.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return a.failure(resp)
	}
	// The answer is decoded as it is read, whatever its size (the usage
	// of 100,000 users is about 18 MB): only the value it decodes to is
	// held. A body cut short, or followed by anything, is an error that
	// says so.
	dec := json.NewDecoder(resp.Body)
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("admin API at %s: %s %s: %w (%w)", a.base, method, path, ErrCutShort, err)
	}
	switch _, err := dec.Token(); {
	case err == nil:
		return fmt.Errorf("admin API at %s: %s %s: %w (more follows the answer)", a.base, method, path, ErrCutShort)
	case !errors.Is(err, io.EOF):
		return fmt.Errorf("admin API at %s: %s %s: %w (%w)", a.base, method, path, ErrCutShort, err)
	}
	return nil
}

// sendable refuses a body (one of the requests of wire.go) with a string
// that is not valid UTF-8: json.Marshal would send each bad byte as
// U+FFFD, and the server would act on another value than the one given
// (a key for another user), where the operator on the database refuses
// it.
func sendable(in any) error {
	v := reflect.Indirect(reflect.ValueOf(in))
	if v.Kind() != reflect.Struct {
		return nil
	}
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.String && !utf8.ValidString(f.String()) {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return fmt.Errorf("%s %q: not valid UTF-8", name, f.String())
		}
	}
	return nil
}

// notFoundError is the server's answer 404 not_found, with its detail:
// notFoundAs names whose record was missing.
type notFoundError struct{ detail string }

func (e *notFoundError) Error() string { return e.detail + ": not found" }

// notFoundAs gives the server's not_found as owner's sentinel (such as
// keys.ErrNotFound for a key or a user), so callers test the remote
// operator's errors with errors.Is as they test the local one's.
func notFoundAs(err, owner error) error {
	if nf, ok := errors.AsType[*notFoundError](err); ok {
		return fmt.Errorf("%s: %w", nf.detail, owner)
	}
	return err
}

// failure is the error of an answer of status 300 or more: a refusal of
// the caller, the problem's detail, or the status.
func (a *AdminClient) failure(resp *http.Response) error {
	var p problem
	json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&p) // a body that is no problem leaves p empty
	if err := a.refusal(resp, p); err != nil {
		return err
	}
	if p.Code != "" {
		if p.Status == http.StatusNotFound && p.Code == "not_found" {
			return &notFoundError{detail: p.Detail}
		}
		return errors.New(p.Detail)
	}
	return fmt.Errorf("admin API at %s: %s", a.base, resp.Status)
}

// streaming is the client for an answer of any length, such as a backup
// or the recorded events: no overall timeout, the caller's context
// bounds it.
func (a *AdminClient) streaming() *http.Client {
	hc := *a.hc
	hc.Timeout = 0
	return &hc
}

// SetBanned bans or unbans a user on the running server.
func (a *AdminClient) SetBanned(ctx context.Context, user string, banned, create bool) (UserInfo, error) {
	var out UserInfo
	err := a.call(ctx, http.MethodPost, "/api/users/"+url.PathEscape(user), UserRequest{Banned: &banned, Create: create}, &out)
	return out, notFoundAs(err, keys.ErrNotFound)
}

// SetPlan moves a user to another plan on the running server.
func (a *AdminClient) SetPlan(ctx context.Context, user, plan string) (UserInfo, error) {
	var out UserInfo
	err := a.call(ctx, http.MethodPost, "/api/users/"+url.PathEscape(user), UserRequest{Plan: plan}, &out)
	return out, notFoundAs(err, keys.ErrNotFound)
}

// Usage reports usage for one user, or for all with user "".
func (a *AdminClient) Usage(ctx context.Context, user string) ([]UsageInfo, error) {
	var out []UsageInfo
	every := *a // every user's usage is an answer of any length (18 MB for 100,000 users)
	every.hc = a.streaming()
	err := every.call(ctx, http.MethodGet, "/api/usage?user="+url.QueryEscape(user), nil, &out)
	return out, notFoundAs(err, keys.ErrNotFound)
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
	req, err := a.newRequest(ctx, http.MethodGet, "/api/backup?target="+url.QueryEscape(target), nil)
	if err != nil {
		return err
	}
	resp, err := a.streaming().Do(req) // a large database takes its time

	if err != nil {
		return fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var p problem
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&p) // a body that is no problem leaves p empty
		if err := a.refusal(resp, p); err != nil {
			return err
		}
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
	return out, notFoundAs(err, invites.ErrNotFound)
}

// RevokeInvite disables an invite on the running server.
func (a *AdminClient) RevokeInvite(ctx context.Context, id string) (InviteInfo, error) {
	var out InviteInfo
	err := a.call(ctx, http.MethodPost, "/api/invites/"+url.PathEscape(id)+"/revoke", nil, &out)
	return out, notFoundAs(err, invites.ErrNotFound)
}

// Cooldowns lists the running server's cooldowns: the invite limits' and
// the guarded routes'.
func (a *AdminClient) Cooldowns(ctx context.Context) ([]CooldownInfo, error) {
	var out []CooldownInfo
	err := a.call(ctx, http.MethodGet, "/api/cooldowns", nil, &out)
	return out, err
}

// ClearCooldown lifts a cooldown on the running server.
func (a *AdminClient) ClearCooldown(ctx context.Context, source, key string) (CooldownInfo, error) {
	var out CooldownInfo
	err := a.call(ctx, http.MethodPost, "/api/cooldowns/clear", ClearCooldownRequest{Source: source, Key: key}, &out)
	return out, notFoundAs(err, ErrNoCooldown)
}
