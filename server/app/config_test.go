package app

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const minimal = "[plans.free]\nmonthly_quota = 10\n"

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// A bad duration names the key, the value and the units to use.
func TestBadDurationSaysWhatToWrite(t *testing.T) {
	_, err := Load(writeConfig(t, "[limits.user]\nwindow = \"10mins\"\n"+minimal), env(nil))
	want := `limits.user.window: "10mins" is not a duration; use e.g. "90s", "10m", "1h"`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want it to contain %q", err, want)
	}
}

// A variable that looks like an override but has single underscores is
// not read, and the warning says how to write it.
func TestSingleUnderscoreVariableIsWarnedAbout(t *testing.T) {
	vars := map[string]string{"BREAKWATER_LIMITS_USER_RATE": "5", "BREAKWATER_ADMIN_TOKEN": "secret"}
	saved := environ
	environ = func() []string { return []string{"BREAKWATER_LIMITS_USER_RATE=5", "BREAKWATER_ADMIN_TOKEN=secret"} }
	t.Cleanup(func() { environ = saved })

	c, err := Load(writeConfig(t, minimal), env(vars))
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.User.Rate == 5 {
		t.Error("the single-underscore variable was read as an override")
	}
	w := c.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "BREAKWATER_LIMITS_USER_RATE is not read") || !strings.Contains(w[0], "BREAKWATER_LIMITS__USER__RATE") {
		t.Errorf("warnings %q, want one naming the variable and the right spelling (and none for the admin token)", w)
	}
}

// ChangedKeys names each key that changed, and NeedsRestart those of them
// a reload cannot apply.
func TestChangedKeys(t *testing.T) {
	old, err := Load(writeConfig(t, minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	next, err := Load(writeConfig(t, "[server]\nlisten = \":9000\"\n[limits.user]\nrate = 7\n[plans.free]\nmonthly_quota = 11\n"+
		"[alerts]\nsmtp_host = \"localhost\"\nfrom = \"a@example.com\"\nto = [\"b@example.com\"]\ntls = \"none\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	changed := ChangedKeys(old, next)
	for _, k := range []string{"server.listen", "limits.user.rate", "plans.free.monthly_quota", "alerts"} {
		if !slices.ContainsFunc(changed, func(c string) bool { return c == k || strings.HasPrefix(c, k+".") }) {
			t.Errorf("ChangedKeys misses %s: %v", k, changed)
		}
	}
	if slices.Contains(changed, "server.admin_listen") {
		t.Errorf("ChangedKeys names an unchanged key: %v", changed)
	}
	restart := NeedsRestart(old, next)
	if !slices.Contains(restart, "server.listen") || slices.Contains(restart, "limits.user.rate") || slices.Contains(restart, "plans.free.monthly_quota") {
		t.Errorf("NeedsRestart = %v, want server.listen and the alerts, not the thresholds", restart)
	}
	if got := ChangedKeys(old, old); len(got) != 0 {
		t.Errorf("a config compared with itself changed %v", got)
	}
}

// The same file loaded twice changes no key, [[routes]] with their
// [routes.fail] included (compared whole, their pointers differed on every
// load, and every reload said changed=routes); a change inside a route is
// named by the route and key, and applies live.
func TestChangedKeysOfRoutes(t *testing.T) {
	body := minimal + `
[[routes]]
name = "referral"
path = "/api/referral"
upstream = "http://127.0.0.1:3000"
identity = "ip"
rate = 10
[routes.fail]
by = ["ip", "json:email"]
reset_on_success = false
`
	path := writeConfig(t, body)
	a, err := Load(path, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(path, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := ChangedKeys(a, b); len(got) != 0 {
		t.Errorf("the same file loaded twice changed %v", got)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(body, "rate = 10", "rate = 11", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := ChangedKeys(a, c); !slices.Equal(got, []string{"routes.referral.rate"}) {
		t.Errorf("ChangedKeys = %v, want [routes.referral.rate]", got)
	}
	if got := NeedsRestart(a, c); len(got) != 0 {
		t.Errorf("NeedsRestart = %v, want none: a route's rate applies live", got)
	}
}

// [[routes]] entries are read with their [routes.fail], checked with
// errors that name the route, and an unknown key inside one is refused.
func TestRoutesConfig(t *testing.T) {
	c, err := Load(writeConfig(t, minimal+`
[[routes]]
name = "checkout"
methods = ["POST"]
path = "/api/checkout"
upstream = "http://127.0.0.1:3000"
identity = "user"
rate = 10
window = "1h"
burst = 2

[[routes]]
name = "referral"
path = "/api/referral"
upstream = "http://127.0.0.1:3000"
identity = "ip"
[routes.fail]
by = ["ip", "json:email"]
uniform_status = 403
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 2 || c.Routes[0].Name != "checkout" || c.Routes[0].Burst != 2 || c.Routes[1].Fail == nil ||
		c.Routes[1].Fail.UniformStatus != 403 || len(c.Routes[1].Fail.By) != 2 {
		t.Errorf("routes %+v", c.Routes)
	}
	for _, tt := range []struct{ body, want string }{
		{"[[routes]]\nname = \"a\"\npath = \"/a\"\nidentity = \"ip\"\nrat = 5\n", "rat"},
		{"[[routes]]\nname = \"a\"\npath = \"/v1/ocr\"\nidentity = \"ip\"\n", `routes "a": path`},
		{"[[routes]]\nname = \"a\"\npath = \"/a\"\nidentity = \"ip\"\n[routes.fail]\nlimit = 3\n", `routes "a": fail`},
	} {
		if _, err := Load(writeConfig(t, minimal+tt.body), env(nil)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%q): %v, want an error naming %q", tt.body, err, tt.want)
		}
	}
}

// The rate limit, the invite protections and a plan's daily line take a
// mode; the quota and the budget refuse one and say why.
func TestModes(t *testing.T) {
	c, err := Load(writeConfig(t, "[limits.user]\nmode = \"shadow\"\n[invites]\nmode = \"shadow\"\n[plans.free]\nmonthly_quota = 10\ndaily_mode = \"shadow\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Limits.User.Shadow() || !c.Invites.Shadow() || !c.Plans["free"].ShadowDaily() {
		t.Errorf("modes not read: %+v %+v %+v", c.Limits.User, c.Invites, c.Plans["free"])
	}
	for _, want := range []string{"limits.user in SHADOW mode", "invites in SHADOW mode", "daily line 10 (shadow)"} {
		if !strings.Contains(c.LayersText(), want) {
			t.Errorf("the start line %q lacks %q", c.LayersText(), want)
		}
	}
	d, err := Load(writeConfig(t, minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if d.Limits.User.Shadow() || d.Invites.Shadow() || d.Plans["free"].ShadowDaily() {
		t.Error("a mode left out is not enforce")
	}
	for _, tc := range []struct{ name, body, want string }{
		{"budget", "[budget]\nmode = \"shadow\"\n" + minimal, "budget.mode: the global budget cannot be shadowed: it is money"},
		{"quota", "[plans.free]\nmonthly_quota = 10\nmode = \"shadow\"\n", "plans.free.mode: a plan's monthly quota cannot be shadowed: it is what the user paid for"},
		{"quota_mode", "[plans.free]\nmonthly_quota = 10\nquota_mode = \"shadow\"\n", "plans.free.quota_mode: a plan's monthly quota cannot be shadowed"},
		{"bad value", "[limits.user]\nmode = \"dry\"\n" + minimal, `limits.user.mode must be "enforce" or "shadow"`},
		{"bad invites", "[invites]\nmode = \"off\"\n" + minimal, `invites.mode must be "enforce" or "shadow"`},
		{"bad daily", "[plans.free]\nmonthly_quota = 10\ndaily_mode = \"x\"\n", `plans.free.daily_mode: must be "enforce" or "shadow"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tc.body), env(nil))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	for _, key := range []string{"limits.user.mode", "invites.mode", "plans.free.daily_mode"} {
		if !appliesLive(key) {
			t.Errorf("%s does not apply live", key)
		}
	}
}

// The public and the admin listener must not be one socket, however the
// addresses are spelled; port 0 (a free port each) never collides.
func TestListenersMustDiffer(t *testing.T) {
	for _, tt := range []struct {
		listen, admin string
		refused       bool
	}{
		{"127.0.0.1:8080", "127.0.0.1:8080", true},
		{":8080", "0.0.0.0:8080", true},
		{"0.0.0.0:8080", ":8080", true},
		{"[::]:8080", "127.0.0.1:8080", true},
		{"127.0.0.1:8080", "0.0.0.0:8080", true},
		{"localhost:8080", "127.0.0.1:8080", true},
		{"[::ffff:127.0.0.1]:8080", "127.0.0.1:8080", true},
		{":http", "127.0.0.1:80", true},
		{"", ":8080", true}, // listen left to its default, :8080
		{"127.0.0.1:0", "127.0.0.1:0", false},
		{"127.0.0.1:8080", "127.0.0.1:8081", false},
		{"0.0.0.0:8080", "[::1]:8080", false},
		{"10.0.0.5:8080", "127.0.0.1:8080", false},
	} {
		t.Run(tt.listen+" "+tt.admin, func(t *testing.T) {
			body := "[server]\nadmin_listen = \"" + tt.admin + "\"\n"
			if tt.listen != "" {
				body += "listen = \"" + tt.listen + "\"\n"
			}
			_, err := Load(writeConfig(t, body+minimal), env(nil))
			if tt.refused && (err == nil || !strings.Contains(err.Error(), "server.admin_listen") || !strings.Contains(err.Error(), "same address as server.listen")) {
				t.Errorf("Load = %v, want the shared address refused", err)
			}
			if !tt.refused && err != nil {
				t.Errorf("Load = %v, want no error", err)
			}
		})
	}
}

// trusted_proxies that trust every address is allowed but warned about:
// every client could then set its own forwarded address.
func TestTrustEveryoneWarns(t *testing.T) {
	for _, tt := range []struct {
		proxies string
		want    []string
	}{
		{`["0.0.0.0/0", "::/0"]`, []string{"0.0.0.0/0, every IPv4 address", "::/0, every IPv6 address"}},
		{`["10.1.2.3/0"]`, []string{"0.0.0.0/0, every IPv4 address"}},
		{`["127.0.0.1/32", "10.0.0.0/8", "::1"]`, nil},
	} {
		t.Run(tt.proxies, func(t *testing.T) {
			c, err := Load(writeConfig(t, "[server]\ntrusted_proxies = "+tt.proxies+"\n"+minimal), env(nil))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range c.Warnings() {
				if strings.Contains(w, "trusted_proxies") {
					got = append(got, w)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("warnings %q, want %d about trusted_proxies", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "any client can then set its own forwarded address") {
					t.Errorf("warning %q, want it to name %q and say why", got[i], w)
				}
			}
		})
	}
}
