package cli_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"breakwater/server/cli"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// notText are the spellings of an id that is not text, %-escaped as they
// reach the admin API's paths, and what the refusal says of each.
var notText = []struct{ name, escaped, why string }{
	{"NUL", "%00", "control character"},
	{"a byte that is no UTF-8", "%FF", "not valid UTF-8"},
	{"an overlong slash", "%C0%AF", "not valid UTF-8"},
	{"a lone surrogate", "%ED%A0%80", "not valid UTF-8"},
	{"a NUL inside", "key_ab%00cd", "control character"},
	{"a line feed inside", "inv_ab%0Acd", "control character"},
	{"DEL", "key_%7F", "control character"},
	{"a C1 control", "inv_%C2%85x", "control character"},
}

// idRoutes are the admin API's routes that take an id in their path.
var idRoutes = []struct{ method, path string }{
	{http.MethodPost, "/api/keys/%s/revoke"},
	{http.MethodPost, "/api/invites/%s/revoke"},
	{http.MethodDelete, "/api/invites/%s"},
	{http.MethodPost, "/api/users/%s"},
	{http.MethodGet, "/api/usage?user=%s"},
}

// An id that is not text (a NUL, bytes that are no UTF-8, a control
// character) is bad input on every admin route that takes one, on bolt
// and on PostgreSQL alike: 400 bad_request saying why, never 500 and an
// ERROR line with PostgreSQL's complaint; the CLI's commands refuse it as
// a usage error (exit 2) before they reach the service.
func TestIDsThatAreNotTextAreRefused(t *testing.T) {
	for _, backend := range []string{"bolt", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			path, env := idsConfig(t, backend)
			cmd := cliOn(path, env)
			if _, err := cmd("keys", "create", "--user", "ann"); err != nil {
				t.Fatal(err)
			}
			a, logs, _ := startApp(t, path, env)
			admin := "http://" + a.AdminAddr()
			checkPathIDs(t, admin)
			checkBodyIDs(t, admin)
			checkCLIIDs(t, path, env)
			checkCLIBodies(t, cmd)
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("the server logged an error:\n%s", logs.String())
			}
			// An id that is text still reaches the service: 404, not 400.
			for _, id := range []string{"key_nope", "%2500", "caf%C3%A9"} {
				if status, p := adminCall(t, admin, http.MethodPost, "/api/keys/"+id+"/revoke", ""); status != http.StatusNotFound {
					t.Errorf("revoke key %s: %d %+v, want 404", id, status, p)
				}
			}
		})
	}
}

// idsConfig writes the config of a served backend ("bolt" or
// "postgres") with an admin API, and returns it with its environment.
func idsConfig(t *testing.T, backend string) (string, func(string) string) {
	t.Helper()
	vars := map[string]string{"BREAKWATER_ADMIN_TOKEN": "ids-test-admin-token"}
	storage := fmt.Sprintf("[storage]\npath = %q\n", filepath.Join(t.TempDir(), "bw.db"))
	if backend == "postgres" {
		storage = "[storage]\nbackend = \"postgres\"\n"
		vars[postgres.EnvURL] = pgtest.NewDatabase(t)
		vars["BREAKWATER_SECRET"] = "ids-test-secret-0123456789abcdef"
	}
	return writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = %q\n", freeAddr(t))+storage+
		"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n"), envFrom(vars)
}

// adminProblem is what the tests read of a problem answer.
type adminProblem struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// adminCall sends one admin API request with the token and a JSON body
// (none if ""), and returns the status and the problem it answered, if
// any.
func adminCall(t *testing.T, admin, method, path, body string) (int, adminProblem) {
	t.Helper()
	req, err := http.NewRequest(method, admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer ids-test-admin-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p adminProblem
	data, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(data, &p) // an answer that is no problem leaves p empty
	return resp.StatusCode, p
}

// checkPathIDs sends each spelling to each route that takes an id in its
// path.
func checkPathIDs(t *testing.T, admin string) {
	t.Helper()
	for _, r := range idRoutes {
		for _, id := range notText {
			status, p := adminCall(t, admin, r.method, fmt.Sprintf(r.path, id.escaped), `{"banned":true}`)
			if status != http.StatusBadRequest || p.Code != "bad_request" || !strings.Contains(p.Detail, id.why) {
				t.Errorf("%s %s: %d %+v, want 400 bad_request saying %q", r.method, fmt.Sprintf(r.path, id.escaped), status, p, id.why)
			}
		}
	}
}

// checkBodyIDs sends each spelling in the bodies that name an id or a
// plan: bytes that are no UTF-8 as they are (a JSON decoder would read
// each as U+FFFD, and two ids as one), the others escaped.
func checkBodyIDs(t *testing.T, admin string) {
	t.Helper()
	bodies := []struct{ method, path, body string }{
		{http.MethodPost, "/api/keys", `{"user":%s}`},
		{http.MethodPost, "/api/keys", `{"user":"bob","plan":%s}`},
		{http.MethodPost, "/api/users/ann", `{"plan":%s}`},
		{http.MethodPost, "/api/cooldowns/clear", `{"key":%s}`},
		{http.MethodPost, "/api/cooldowns/clear", `{"source":%s,"key":"ip:192.0.2.1"}`},
	}
	for _, b := range bodies {
		for _, id := range notText {
			raw, err := url.PathUnescape(id.escaped)
			if err != nil {
				t.Fatal(err)
			}
			value, _ := json.Marshal(raw) // control characters escaped
			if !strings.Contains(id.why, "control") {
				value = []byte(`"` + raw + `"`)
			}
			body := fmt.Sprintf(b.body, value)
			if status, p := adminCall(t, admin, b.method, b.path, body); status != http.StatusBadRequest || p.Code != "bad_request" {
				t.Errorf("%s %s %q: %d %+v, want 400 bad_request", b.method, b.path, body, status, p)
			}
		}
	}
}

// checkCLIIDs runs the commands that take a key's, an invite's or a
// cooldown's id with each spelling: a usage error that names the command
// and says why.
func checkCLIIDs(t *testing.T, path string, env func(string) string) {
	t.Helper()
	commands := [][]string{{"keys", "revoke"}, {"invites", "revoke"}, {"invites", "delete"}, {"cooldowns", "clear"}}
	for _, args := range commands {
		for _, id := range notText {
			raw, err := url.PathUnescape(id.escaped)
			if err != nil {
				t.Fatal(err)
			}
			out, err := cliOn(path, env)(append(args, raw)...)
			name := strings.Join(args, " ") + ": "
			if !errors.Is(err, cli.ErrUsage) || cli.ExitCode(err, io.Discard) != 2 || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), id.why) {
				t.Errorf("%v %q: %v, want a usage error (exit 2) saying %q", args, raw, err, name+"... "+id.why)
			}
			if out != "" {
				t.Errorf("%v %q printed %q", args, raw, out)
			}
		}
	}
	out, err := cliOn(path, env)("cooldowns", "clear", "ip:192.0.2.1", "--source", "route:\x00")
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "control character") || out != "" {
		t.Errorf("cooldowns clear --source with a NUL: %q %v, want a usage error", out, err)
	}
}

// checkCLIBodies runs the commands whose values travel in an admin API
// body with bytes that are no UTF-8: refused, where a JSON encoder would
// send each bad byte as U+FFFD and the server act on another value (a
// key for user "\ufffd"). On bolt the commands go through the running
// server's admin API, on PostgreSQL to the database.
func checkCLIBodies(t *testing.T, cmd func(...string) (string, error)) {
	t.Helper()
	for _, args := range [][]string{
		{"keys", "create", "--user", "\xff"},
		{"keys", "create", "--user", "bob", "--plan", "\xc0\xaf"},
		{"users", "set-plan", "ann", "\xed\xa0\x80"},
		{"invites", "create", "--note", "\xff"},
	} {
		if out, err := cmd(args...); err == nil {
			t.Errorf("%q: %q, want a refusal", args, out)
		}
	}
	for _, list := range [][]string{{"keys", "list"}, {"invites", "list"}} {
		if out, err := cmd(list...); err != nil || strings.Contains(out, "\ufffd") || strings.Contains(out, "bob") {
			t.Errorf("%v after the refusals: %q %v", list, out, err)
		}
	}
}
