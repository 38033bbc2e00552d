package cli_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
)

// An operator lists the invite cooldowns and lifts one for a legitimate
// user: through the admin API while serving, and on the database (the
// written-behind state) while stopped.
func TestCooldownsListAndClear(t *testing.T) {
	dir := t.TempDir()
	path := operatorConfig(t, freeAddr(t), filepath.Join(dir, "bw.db"), "[invites]\nfail_limit = 2\n")
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "cooldowns-test-token"})
	cmd := cliOn(path, env)
	if _, err := cmd("keys", "create", "--user", "ann"); err != nil {
		t.Fatal(err)
	}
	a, _, stop := startApp(t, path, env)
	code, err := cmd("invites", "create", "--uses", "5")
	if err != nil {
		t.Fatal(err)
	}
	code = strings.TrimSpace(code[strings.LastIndex(strings.TrimSpace(code), "\n")+1:])
	verify := func(code, email string) int {
		t.Helper()
		resp, err := http.Post("http://"+a.Addr()+"/v1/invites/verify", "application/json", strings.NewReader(fmt.Sprintf(`{"code":%q,"email":%q}`, code, email)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 2 {
		verify("2222-2222-2222", "ann@example.com")
	}
	if got := verify(code, "ann@example.com"); got != http.StatusForbidden {
		t.Fatalf("the right code during the cooldown: %d, want 403", got)
	}
	out, err := cmd("cooldowns", "list")
	if err != nil || !strings.Contains(out, "email:ann@example.com") || !strings.Contains(out, "ip:127.0.0.1") {
		t.Fatalf("cooldowns list while serving: %v\n%s", err, out)
	}
	if out, err := cmd("cooldowns", "clear", "email:ann@example.com"); err != nil || !strings.Contains(out, "lifted") {
		t.Fatalf("cooldowns clear: %q %v", out, err)
	}
	if _, err := cmd("cooldowns", "clear", "email:nobody@example.com"); err == nil || !strings.Contains(err.Error(), "no cooldown is on") {
		t.Errorf("clear of a key in no cooldown: %v", err)
	}
	if out, _ := cmd("cooldowns", "list"); strings.Contains(out, "email:ann@example.com") {
		t.Errorf("cleared key still listed:\n%s", out)
	}

	// Stopped: the IP's cooldown was written behind, and is lifted on the
	// database so that the next start does not bring it back.
	stop()
	out, err = cmd("cooldowns", "list", "--json")
	if err != nil || !strings.Contains(out, `"key": "ip:127.0.0.1"`) || strings.Contains(out, "email:ann") {
		t.Fatalf("cooldowns list stopped: %v\n%s", err, out)
	}
	if _, err := cmd("cooldowns", "clear", "ip:127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	a, _, _ = startApp(t, path, env)
	if got := verify(code, "ann@example.com"); got != http.StatusOK {
		t.Errorf("the right code after both cooldowns were lifted: %d, want 200", got)
	}
}

// newReferralApp is an app whose referral check answers 200 to a body
// holding "RIGHT" and 404 to any other; reached counts its requests.
func newReferralApp(t *testing.T) (up *httptest.Server, reached *atomic.Int64) {
	reached = &atomic.Int64{}
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "RIGHT") {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(up.Close)
	return up, reached
}

// referralRoute is a guarded route to upstream's referral check that
// puts an IP in a ten-minute cooldown after five 404s.
func referralRoute(upstream string) string {
	return fmt.Sprintf(`
[[routes]]
name = "referral"
methods = ["POST"]
path = "/api/referral/check"
upstream = %q
identity = "ip"
rate = 0
burst = 0

[routes.fail]
statuses = [404]
by = ["ip"]
limit = 5
window = "10m"
cooldown = "10m"
`, upstream)
}

// A guarded route's fail limit is listed and lifted with the invite
// guard's: five wrong answers from the app put the client's IP in a
// cooldown that cooldowns list shows under route:referral, a bare key
// still means the invite guard, and clear --source route:referral lets
// the next request reach the app; while serving and while stopped.
func TestCooldownsListAndClearRoute(t *testing.T) {
	up, reached := newReferralApp(t)
	dir := t.TempDir()
	path := operatorConfig(t, freeAddr(t), filepath.Join(dir, "bw.db"), referralRoute(up.URL))
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "cooldowns-test-token"})
	cmd := cliOn(path, env)
	if _, err := cmd("keys", "create", "--user", "ann"); err != nil {
		t.Fatal(err)
	}
	check := func(addr, code string) int {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/api/referral/check", "application/json", strings.NewReader(fmt.Sprintf(`{"code":%q}`, code)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// coolDown makes five failures and checks that the right code is now
	// refused without reaching the app.
	coolDown := func(addr string) {
		t.Helper()
		for i := range 5 {
			if got := check(addr, "WRONG"); got != http.StatusNotFound {
				t.Fatalf("wrong code %d: %d, want the app's 404", i+1, got)
			}
		}
		before := reached.Load()
		if got := check(addr, "RIGHT"); got == http.StatusOK || reached.Load() != before {
			t.Fatalf("the right code during the cooldown: %d, reached the app: %v", got, reached.Load() != before)
		}
	}
	lifted := func(addr string) {
		t.Helper()
		before := reached.Load()
		if got := check(addr, "RIGHT"); got != http.StatusOK || reached.Load() != before+1 {
			t.Fatalf("the right code after the cooldown was lifted: %d, reached the app: %v", got, reached.Load() != before)
		}
	}
	noBareKey := func() {
		t.Helper()
		if _, err := cmd("cooldowns", "clear", "ip:127.0.0.1"); err == nil || !strings.Contains(err.Error(), "no cooldown is on") {
			t.Errorf("a bare key is the invite guard's, which has no cooldown on it: %v", err)
		}
	}

	a, _, stop := startApp(t, path, env)
	coolDown(a.Addr())
	out, err := cmd("cooldowns", "list")
	if err != nil || !regexp.MustCompile(`route:referral\s+ip:127\.0\.0\.1\s`).MatchString(out) {
		t.Fatalf("cooldowns list while serving: %v\n%s", err, out)
	}
	noBareKey()
	if out, err := cmd("cooldowns", "clear", "ip:127.0.0.1", "--source", "route:nosuch"); err == nil {
		t.Errorf("clear on a route that does not exist: %q", out)
	}
	if out, err := cmd("cooldowns", "clear", "ip:127.0.0.1", "--source", "route:referral"); err != nil || !strings.Contains(out, "lifted") {
		t.Fatalf("cooldowns clear --source route:referral while serving: %q %v", out, err)
	}
	if out, _ := cmd("cooldowns", "list"); strings.Contains(out, "route:referral") {
		t.Errorf("cleared key still listed:\n%s", out)
	}
	lifted(a.Addr())

	// Stopped: the cooldown was written behind; it is listed and lifted on
	// the database, and the next start does not bring it back.
	coolDown(a.Addr())
	stop()
	out, err = cmd("cooldowns", "list", "--json")
	if err != nil || !strings.Contains(out, `"source": "route:referral"`) || !strings.Contains(out, `"key": "ip:127.0.0.1"`) {
		t.Fatalf("cooldowns list stopped: %v\n%s", err, out)
	}
	noBareKey()
	if out, err := cmd("cooldowns", "clear", "ip:127.0.0.1", "--source", "route:referral"); err != nil || !strings.Contains(out, "lifted") {
		t.Fatalf("cooldowns clear --source route:referral stopped: %q %v", out, err)
	}
	a, _, _ = startApp(t, path, env)
	lifted(a.Addr())
}
