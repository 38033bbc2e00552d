package cli_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"breakwater/detect"
	"breakwater/server/app"
	"breakwater/server/cli"
	"breakwater/server/invites"
	"breakwater/storage"
)

// lockedBuffer collects a running command's output for polling.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls out until re matches, and returns the first submatch.
func waitFor(t *testing.T, out *lockedBuffer, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[len(m)-1]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no match for %s in:\n%s", re, out.String())
	return ""
}

func envFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const minimalConfig = `
[plans.free]
monthly_quota = 10
`

func TestShippedConfigIsValid(t *testing.T) {
	c, err := app.Load("config.toml", envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Plans["free"].MonthlyQuota == 0 || c.OCR.Provider != "gemini" || c.Storage.Path != filepath.Join(cwd(t), "data", "breakwater.db") || c.Auth.JWT.Enabled() {
		t.Errorf("unexpected shipped config: %+v", c)
	}
	// The shipped [invites] spells out the defaults.
	def := invites.Config{}.WithDefaults()
	if c.Invites.Rate != def.Rate || c.Invites.Window != def.Window || c.Invites.Burst != def.Burst ||
		c.Invites.Fail() != def.Fail() {
		t.Errorf("shipped [invites] %+v differs from the defaults %+v", c.Invites, def)
	}
}

func TestInviteConfigDefaultsAndOverrides(t *testing.T) {
	c, err := app.Load(writeConfig(t, minimalConfig), envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	f := c.Invites.Fail()
	if c.Invites.Rate != 50 || c.Invites.Window != 10*time.Minute || c.Invites.Burst != 3 || f.Limit != 5 ||
		f.Window != 10*time.Minute || f.Cooldown != 10*time.Minute || f.Backoff || f.MaxCooldown != 24*time.Hour ||
		f.Decay || f.GlobalPerHour != 1000 {
		t.Errorf("defaults %+v / %+v", c.Invites, f)
	}
	c, err = app.Load(writeConfig(t, "[invites]\nreset_on_success = false\nbackoff = true\n"+minimalConfig),
		envFrom(map[string]string{"BREAKWATER_INVITES__FAIL_LIMIT": "7"}))
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Invites.Fail(); !f.Decay || !f.Backoff || f.Limit != 7 {
		t.Errorf("overrides not applied: %+v", f)
	}
	c, err = app.Load(writeConfig(t, minimalConfig), envFrom(map[string]string{"BREAKWATER_INVITES__RESET_ON_SUCCESS": "false"}))
	if err != nil || !c.Invites.Fail().Decay {
		t.Errorf("reset_on_success from the environment: %v %+v", err, c.Invites)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	cases := []struct {
		name string
		toml string
		env  map[string]string
		want string
	}{
		{"typo", "[server]\nlisen = \":80\"\n" + minimalConfig, nil, `"server.lisen"`},
		{"unknown section", "[budgte]\ntimezone = \"UTC\"\n" + minimalConfig, nil, `"budgte.timezone"`},
		{"typo in a plan", "[plans.free]\nmonthly_quot = 10\n", nil, `"plans.free.monthly_quot"`},
		{"bad duration", "[ocr]\ntimeout = \"5 parsecs\"\n" + minimalConfig, nil, "ocr.timeout"},
		{"negative", "[server]\nmax_image_bytes = -1\n" + minimalConfig, nil, "server.max_image_bytes"},
		{"unknown provider", "[ocr]\nprovider = \"openai\"\n" + minimalConfig, nil, "ocr.provider"},
		{"bad zone", "[budget]\ntimezone = \"Mars/Olympus\"\n" + minimalConfig, nil, "budget.timezone"},
		{"no plans", "[server]\nlisten = \":80\"\n", nil, "plans"},
		{"zero quota", "[plans.free]\nmonthly_quota = 0\n", nil, "plans.free.monthly_quota"},
		{"bad proxy", "[server]\ntrusted_proxies = [\"nope\"]\n" + minimalConfig, nil, "server.trusted_proxies"},
		{"unknown client IP header", "[server]\nclient_ip_header = \"Forwarded\"\n" + minimalConfig, nil, "server.client_ip_header"},
		{"negative side", "[server]\nmax_image_side = -1\n" + minimalConfig, nil, "server.max_image_side"},
		{"bad env value", minimalConfig, map[string]string{"BREAKWATER_OCR__TIMEOUT": "soon"}, "ocr.timeout"},
		{"bad env number", minimalConfig, map[string]string{"BREAKWATER_SERVER__MAX_IMAGE_BYTES": "lots"}, "server.max_image_bytes"},
		{"not toml", "[server\n", nil, "config"},
		{"bool for a number", "[server]\nmax_image_bytes = true\n" + minimalConfig, nil, "server.max_image_bytes"},
		{"fraction for a whole number", "[plans.free]\nmonthly_quota = 2.9\n", nil, "plans.free.monthly_quota"},
		{"number for a duration", "[ocr]\ntimeout = 30\n" + minimalConfig, nil, "ocr.timeout"},
		{"negative budget", "[budget]\ndaily_usd = -1\n" + minimalConfig, nil, "budget.daily_usd"},
		{"negative line", "[plans.free]\nmonthly_quota = 1\ndaily_attempts = -1\n", nil, "plans.free.daily_attempts"},
		{"window too long", "[limits.user]\nrate = 5\nwindow = \"2h\"\n" + minimalConfig, nil, "limits.user.window"},
		{"typo in limits", "[limits.user]\nrat = 5\n" + minimalConfig, nil, `"limits.user.rat"`},
		{"typo in invites", "[invites]\nfail_limt = 5\n" + minimalConfig, nil, `"invites.fail_limt"`},
		{"negative fail limit", "[invites]\nfail_limit = -1\n" + minimalConfig, nil, "invites.fail_limit"},
		{"invite window too long", "[invites]\nwindow = \"2h\"\n" + minimalConfig, nil, "invites.window"},
		{"cooldown past its cap", "[invites]\ncooldown = \"2h\"\nmax_cooldown = \"1h\"\n" + minimalConfig, nil, "invites.max_cooldown"},
		{"bad reset_on_success", minimalConfig, map[string]string{"BREAKWATER_INVITES__RESET_ON_SUCCESS": "sometimes"}, "invites.reset_on_success"},
		{"typo in auth.jwt", "[auth.jwt]\njwks_uri = \"https://x.test/jwks\"\n" + minimalConfig, nil, `"auth.jwt.jwks_uri"`},
		{"jwt without issuer", "[auth.jwt]\njwks_url = \"https://x.test/jwks\"\n" + minimalConfig, nil, "auth.jwt.issuer"},
		{"jwt issuer without jwks_url", "[auth.jwt]\nissuer = \"https://x.test/\"\n" + minimalConfig, nil, "auth.jwt.jwks_url"},
		{"jwt over plain http", "[auth.jwt]\njwks_url = \"http://x.test/jwks\"\nissuer = \"https://x.test/\"\n" + minimalConfig, nil, "auth.jwt.jwks_url"},
		{"jwt unknown default plan", "[auth.jwt]\njwks_url = \"https://x.test/jwks\"\nissuer = \"https://x.test/\"\ndefault_plan = \"gold\"\n" + minimalConfig, nil, "auth.jwt.default_plan"},
		{"jwt negative leeway", "[auth.jwt]\njwks_url = \"https://x.test/jwks\"\nissuer = \"https://x.test/\"\nleeway = \"-1s\"\n" + minimalConfig, nil, "auth.jwt.leeway"},
		{"jwt refresh too often", "[auth.jwt]\njwks_url = \"https://x.test/jwks\"\nissuer = \"https://x.test/\"\nrefresh_interval = \"10ms\"\n" + minimalConfig, nil, "auth.jwt.refresh_interval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := app.Load(writeConfig(t, c.toml), envFrom(c.env))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one naming %s", err, c.want)
			}
		})
	}
}

func TestConfigEnvironmentTypoIsRefused(t *testing.T) {
	t.Setenv("BREAKWATER_SERVER__MAX_IMAGE_BYTE", "5")
	_, err := app.Load(writeConfig(t, minimalConfig), os.Getenv)
	if err == nil || !strings.Contains(err.Error(), "BREAKWATER_SERVER__MAX_IMAGE_BYTE") {
		t.Errorf("error %v, want one naming the variable", err)
	}
}

func TestConfigEnvironmentOverrides(t *testing.T) {
	path := writeConfig(t, "[server]\nlisten = \":80\"\n"+minimalConfig)
	c, err := app.Load(path, envFrom(map[string]string{
		"BREAKWATER_SERVER__LISTEN":                "127.0.0.1:9999",
		"BREAKWATER_SERVER__TRUSTED_PROXIES":       "127.0.0.1, 10.0.0.0/8",
		"BREAKWATER_OCR__TIMEOUT":                  "7s",
		"BREAKWATER_OCR__PRICE__MAX_OUTPUT_TOKENS": "128",
		"BREAKWATER_PLANS__FREE__MONTHLY_QUOTA":    "42",
		"BREAKWATER_ADMIN_TOKEN":                   "not a config key",
		"BREAKWATER_AUTH__JWT__JWKS_URL":           "https://clerk.example.com/.well-known/jwks.json",
		"BREAKWATER_AUTH__JWT__ISSUER":             "https://clerk.example.com",
		"BREAKWATER_AUTH__JWT__AUTHORIZED_PARTIES": "https://app.example.com, https://www.example.com",
		"BREAKWATER_AUTH__JWT__LEEWAY":             "10s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Listen != "127.0.0.1:9999" || len(c.Server.TrustedProxies) != 2 || c.OCR.Timeout != 7*time.Second ||
		c.OCR.Price.MaxOutputTokens != 128 || c.Plans["free"].MonthlyQuota != 42 {
		t.Errorf("overrides not applied: %+v", c)
	}
	if j := c.Auth.JWT; !j.Enabled() || j.Issuer != "https://clerk.example.com" || len(j.AuthorizedParties) != 2 ||
		j.Leeway != 10*time.Second || j.DefaultPlan != "free" || j.RefreshInterval != 5*time.Minute {
		t.Errorf("auth.jwt overrides or defaults not applied: %+v", j)
	}
}

func TestConfigCheckCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"config", "check", "--config", writeConfig(t, "[server]\nlisen = 1\n")}, envFrom(nil), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "server.lisen") {
		t.Errorf("config check: %v", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"config", "check", "--config", "config.toml"}, envFrom(map[string]string{"GEMINI_API_KEY": "test-key"}), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "OK") {
		t.Errorf("config check printed %q", out.String())
	}

	// Where serve would refuse to start, config check fails too (exit 1)
	// and says why.
	for _, tt := range []struct {
		name, config string
		env          map[string]string
		want         string
	}{
		{"no Gemini key", "config.toml", nil, "GEMINI_API_KEY is not set"},
		{"short token off loopback", writeConfig(t, "[server]\nadmin_listen = \"0.0.0.0:8081\"\n[ocr]\nprovider = \"simulated\"\n"+minimalConfig),
			map[string]string{"BREAKWATER_ADMIN_TOKEN": "short"}, "at least 32 characters"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), []string{"config", "check", "--config", tt.config}, envFrom(tt.env), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "serve would refuse to start") || !strings.Contains(err.Error(), tt.want) || cli.ExitCode(err, io.Discard) != 1 {
				t.Errorf("config check: %v, want exit 1 naming %q", err, tt.want)
			}
		})
	}
}

// config check names the money keys a file leaves to their defaults,
// which a running server that set them refuses to lose on a reload.
func TestConfigCheckNamesTheMoneyDefaults(t *testing.T) {
	var out bytes.Buffer
	path := writeConfig(t, "[ocr]\nprovider = \"simulated\"\n[budget]\ndaily_usd = 2\ntimezone = \"UTC\"\nmonthly_usd = 20\n"+
		"[plans.free]\nmonthly_quota = 10\ndaily_attempts = 3\n[plans.pro]\nmonthly_quota = 100\n")
	if err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := "note: this file leaves money keys to their defaults: budget.daily_requests (default 5000), " +
		"ocr.price.input_usd_per_million (default ocr.model's list price on each day, now 0.3), ocr.price.output_usd_per_million (default ocr.model's list price on each day, now 2.5), plans.pro.daily_attempts (default 50); " +
		"a running server whose config set one of them refuses to reload this file"
	if !strings.Contains(out.String(), want) {
		t.Errorf("config check printed:\n%s\nwant it to contain %q", out.String(), want)
	}
}

// config check warns about trusted_proxies that trust every address, and
// refuses (exit 1), as serve does, an admin address that is the public
// one spelled another way.
func TestConfigCheckProxiesAndListeners(t *testing.T) {
	var out bytes.Buffer
	trustAll := writeConfig(t, "[server]\ntrusted_proxies = [\"0.0.0.0/0\", \"::/0\"]\n[ocr]\nprovider = \"simulated\"\n"+minimalConfig)
	if err := run(context.Background(), []string{"config", "check", "--config", trustAll}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"warning: server.trusted_proxies holds 0.0.0.0/0", "warning: server.trusted_proxies holds ::/0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config check printed:\n%s\nwant %q", out.String(), want)
		}
	}

	port := strings.TrimPrefix(freeAddr(t), "127.0.0.1")
	shared := writeConfig(t, fmt.Sprintf("[server]\nlisten = %q\nadmin_listen = %q\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n",
		port, "0.0.0.0"+port, filepath.Join(t.TempDir(), "bw.db"))+minimalConfig)
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": strings.Repeat("t", 32)})
	const want = "is the same address as server.listen"
	err := run(context.Background(), []string{"config", "check", "--config", shared}, env, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), want) || cli.ExitCode(err, io.Discard) != 1 {
		t.Errorf("config check: %v, want exit 1 saying %q", err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run(ctx, []string{"serve", "--config", shared}, env, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("serve: %v, want a refusal saying %q", err, want)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		// usage is the usage line printed on stderr ("" for none),
		// notUsage one that must not be: another command's.
		usage, notUsage, msg string
	}{
		{"unknown command", []string{"frobnicate"}, "", "", `unknown command "frobnicate"`},
		{"unknown command with --config", []string{"--config", "x.toml", "frobnicate"}, "", "", `unknown command "frobnicate"`},
		{"unknown flag of the root", []string{"--nope"}, "", "", "unknown flag: --nope"},
		{"a group alone", []string{"keys"}, "breakwater keys COMMAND", "invites", "keys: missing command"},
		{"unknown command of a group", []string{"invites", "frob"}, "breakwater invites COMMAND", "keys create", `invites: unknown command "frob"`},
		{"a flag of another command", []string{"keys", "list", "--uses", "5"}, "breakwater keys list [--json]", "--uses", "keys list: unknown flag: --uses"},
		{"a required flag missing", []string{"keys", "create"}, "breakwater keys create --user ID [--plan NAME]", "keys list", "keys create: --user is required"},
		{"a missing argument", []string{"keys", "revoke"}, "breakwater keys revoke KEY_ID", "invites", "keys revoke: missing KEY_ID"},
		{"two missing arguments", []string{"users", "set-plan"}, "breakwater users set-plan ID PLAN", "keys", "users set-plan: missing ID PLAN"},
		{"an extra argument", []string{"usage", "ann", "bob"}, "breakwater usage [ID] [--json]", "keys", `usage: unexpected argument "bob"`},
		{"an argument to serve", []string{"serve", "now"}, "breakwater serve", "keys", `serve: unexpected argument "now"`},
		{"a bad flag value", []string{"invites", "create", "--uses", "two"}, "breakwater invites create", "keys", `invalid argument "two"`},
		{"no uses", []string{"invites", "create", "--uses", "0"}, "breakwater invites create", "keys", "--uses 0"},
		{"brake neither on nor off", []string{"brake", "maybe"}, "breakwater brake on|off", "keys", `brake: "maybe": want on or off`},
		{"config alone", []string{"config"}, "breakwater config COMMAND", "keys", "config: missing command"},
		{"serve with an unknown flag", []string{"serve", "--nope"}, "breakwater serve", "keys", "serve: unknown flag: --nope"},
		{"help on an unknown command", []string{"help", "frobnicate"}, "", "", `unknown command "frobnicate"`},
		{"completion without a shell", []string{"completion"}, "breakwater completion COMMAND", "keys", "completion: missing command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			// The config is never read: the command line is refused first.
			args := append(c.args, "--config", filepath.Join(t.TempDir(), "none.toml"))
			err := run(context.Background(), args, envFrom(nil), &out, &errOut)
			if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("%v: %v, want a usage error saying %q", c.args, err, c.msg)
			}
			if out.Len() != 0 {
				t.Errorf("%v printed on stdout:\n%s", c.args, out.String())
			}
			switch {
			case c.usage == "":
				if errOut.Len() != 0 {
					t.Errorf("%v printed a usage:\n%s", c.args, errOut.String())
				}
			case !strings.Contains(errOut.String(), "Usage:\n  "+c.usage):
				t.Errorf("%v printed, on stderr:\n%s\nwant the usage %q", c.args, errOut.String(), c.usage)
			case c.notUsage != "" && strings.Contains(errOut.String(), c.notUsage):
				t.Errorf("%v printed another command's usage (%q):\n%s", c.args, c.notUsage, errOut.String())
			}
			if strings.Contains(errOut.String(), err.Error()) {
				t.Errorf("%v printed its error itself; the caller prints it once:\n%s", c.args, errOut.String())
			}
		})
	}
}

// commands are the commands the top level help lists.
var commands = []string{"serve", "demo", "keys", "users", "invites", "usage", "budget", "brake", "backup", "detect", "config", "version", "completion", "help"}

func TestHelpListsTheCommands(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"--config", "x.toml", "--help"}} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, envFrom(nil), &out, &errOut); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, c := range commands {
			if !regexp.MustCompile(`(?m)^  ` + c + ` +\S`).MatchString(out.String()) {
				t.Errorf("%v does not list %s:\n%s", args, c, out.String())
			}
		}
		if errOut.Len() != 0 {
			t.Errorf("%v printed on stderr:\n%s", args, errOut.String())
		}
	}
}

// TestCommandHelpShowsItsOwnFlags: CMD -h prints that command's flags
// (and --config, which every command takes), none of another command's.
func TestCommandHelpShowsItsOwnFlags(t *testing.T) {
	cases := []struct {
		args      []string
		want, not []string
	}{
		{[]string{"keys", "list", "-h"}, []string{"breakwater keys list [--json]", "--json", "--config FILE"}, []string{"--uses", "--user", "--day"}},
		{[]string{"keys", "create", "--help"}, []string{"--user ID", "--plan NAME", "alone on the last line"}, []string{"--json", "--uses"}},
		{[]string{"invites", "create", "-h"}, []string{"--uses N", "--expires", "--note TEXT"}, []string{"--user", "--json"}},
		{[]string{"detect", "run", "-h"}, []string{"--day YYYY-MM-DD", "--no-mail", "--json"}, []string{"--user", "--uses"}},
		{[]string{"serve", "--help"}, []string{"breakwater serve", "--config FILE"}, []string{"--json", "--user"}},
		{[]string{"help", "backup"}, []string{"breakwater backup FILE"}, []string{"--json", "--user"}},
		{[]string{"keys", "-h"}, []string{"breakwater keys COMMAND", "create", "list", "revoke"}, []string{"invites", "--user"}},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), c.args, envFrom(nil), &out, &errOut); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v does not show %q:\n%s", c.args, w, out.String())
			}
		}
		for _, n := range c.not {
			if strings.Contains(out.String(), n) {
				t.Errorf("%v shows %q, another command's:\n%s", c.args, n, out.String())
			}
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"completion", shell}, envFrom(nil), &out, io.Discard); err != nil {
			t.Fatalf("completion %s: %v", shell, err)
		}
		if !strings.Contains(out.String(), "breakwater") || out.Len() < 1000 {
			t.Errorf("completion %s printed %d bytes:\n%.300s", shell, out.Len(), out.String())
		}
	}
	// The script asks the binary; the binary knows the commands and flags.
	var out bytes.Buffer
	if err := run(context.Background(), []string{"__complete", "keys", "list", "--"}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--json") || strings.Contains(out.String(), "--uses") {
		t.Errorf("completing keys list flags gave:\n%s", out.String())
	}
}

// TestExitCodes runs the program as a process (the test binary running
// run, as in the crash test): 0 for help, 2 for a usage error, 1 for an
// error, and the error printed once.
func TestExitCodes(t *testing.T) {
	cases := []struct {
		args   string
		code   int
		stderr string
	}{
		{"--help", 0, ""},
		{"keys list --uses 5", 2, "breakwater: keys list: unknown flag: --uses\n"},
		{"frobnicate", 2, "breakwater: unknown command \"frobnicate\""},
		{"config check --config " + filepath.Join(t.TempDir(), "none.toml"), 1, "breakwater: config "},
	}
	for _, c := range cases {
		child := exec.Command(os.Args[0], "-test.run=^$")
		child.Env = append(os.Environ(), childArgs+"="+c.args)
		var errOut bytes.Buffer
		child.Stderr = &errOut
		err := child.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || !strings.Contains(errOut.String(), c.stderr) || strings.Count(errOut.String(), "breakwater: ") > 1 {
			t.Errorf("breakwater %s: exit %d, stderr:\n%s\nwant exit %d and %q once", c.args, code, errOut.String(), c.code, c.stderr)
		}
	}
}

// freeAddr finds a loopback port that is free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitUp polls url until it answers, and returns the status, or fails the
// test when done says the server stopped first.
func waitUp(t *testing.T, url string, done <-chan error) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return resp.StatusCode
		}
		select {
		case err := <-done:
			t.Fatalf("the server stopped before %s answered: %v", url, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s never answered", url)
	return 0
}

// startApp opens the service that the config at path describes, as serve
// does, and closes it when the test ends or at stop. Its log is returned
// for the tests that check what serve logs; addresses come from the App.
func startApp(t *testing.T, path string, env func(string) string) (a *app.App, logs *lockedBuffer, stop func()) {
	t.Helper()
	c, err := app.Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	logs = &lockedBuffer{}
	a, err = app.Open(context.Background(), c, app.Options{Getenv: env, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(a.Close) }
	t.Cleanup(stop)
	return a, logs, stop
}

// TestServeEndToEnd runs the real binary's run: serve on a free port,
// polled on /healthz, keys through the admin API while serving, a request
// in flight at shutdown, keys directly on the database once stopped.
func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	addr, adminAddr := freeAddr(t), freeAddr(t)
	gemini, geminiCalled := slowGemini(t, 500*time.Millisecond)
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = %q
admin_listen = %q
[storage]
path = %q
[ocr]
base_url = %q
[plans.free]
monthly_quota = 10
`, addr, adminAddr, filepath.Join(dir, "data", "bw.db"), gemini.URL))
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "e2e-admin-token", "GEMINI_API_KEY": "test-key"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--config", path}, env, io.Discard, logs) }()
	if status := waitUp(t, "http://"+addr+"/healthz", done); status != http.StatusOK {
		t.Fatalf("healthz: %d", status)
	}
	if status := waitUp(t, "http://"+adminAddr+"/api/budget", done); status != http.StatusUnauthorized {
		t.Fatalf("the admin API without a token: %d", status)
	}

	key := checkKeysWhileServing(t, path, env)
	checkDetectRunWhileServing(t, path, env)
	checkOperatorWhileServing(t, dir, path, env)
	checkInFlightAtShutdown(t, addr, key, geminiCalled, cancel, done)
	checkKeysStopped(t, path, key)
}

// checkKeysWhileServing: a second server on the database at path is
// refused; keys create goes through the admin API and prints the key,
// which it returns; without the admin token a command says what to set.
func checkKeysWhileServing(t *testing.T, path string, env func(string) string) string {
	// A second server on the same database is refused at once.
	err := run(context.Background(), []string{"serve", "--config", path}, env, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "locked by another breakwater process") {
		t.Errorf("second serve: %v", err)
	}

	// keys create while serving goes through the admin API.
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "create", "--user", "erin", "--config", path}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	key := lines[len(lines)-1]
	if !regexp.MustCompile(`^bw_[0-9A-Za-z]{32,}$`).MatchString(key) {
		t.Fatalf("last line %q is not a key", key)
	}
	// Without the admin token the command explains what to set.
	err = run(context.Background(), []string{"keys", "list", "--config", path}, envFrom(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "BREAKWATER_ADMIN_TOKEN") {
		t.Errorf("keys list without token: %v", err)
	}
	return key
}

// checkDetectRunWhileServing: detect run while serving goes through POST
// /api/detect/run; a day not YYYY-MM-DD or pruned is refused.
func checkDetectRunWhileServing(t *testing.T, path string, env func(string) string) {
	// detect run while serving goes through POST /api/detect/run.
	var out bytes.Buffer
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format("2006-01-02")
	if err := run(context.Background(), []string{"detect", "run", "--day", yesterday, "--no-mail", "--config", path}, env, &out, io.Discard); err != nil {
		t.Fatalf("detect run while serving: %v", err)
	}
	if !strings.Contains(out.String(), "detection for "+yesterday+": 0 attempts") || !strings.Contains(out.String(), "no findings") {
		t.Errorf("detect run while serving printed %q", out.String())
	}
	if err := run(context.Background(), []string{"detect", "run", "--day", "1 March", "--config", path}, env, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "YYYY-MM-DD") {
		t.Errorf("detect run with a bad day: %v", err)
	}
	if err := run(context.Background(), []string{"detect", "run", "--day", "2020-03-01", "--config", path}, env, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "stats_retention_days") {
		t.Errorf("detect run of a pruned day: %v", err)
	}
}

// checkOperatorWhileServing: bans, the brake, budget --json and backup
// (into dir) go through the admin API while serving.
func checkOperatorWhileServing(t *testing.T, dir, path string, env func(string) string) {
	// Operator commands through the admin API while serving.
	var out bytes.Buffer
	for _, args := range [][]string{{"users", "ban", "erin"}, {"users", "unban", "erin"}, {"brake", "on"}, {"brake", "off"}} {
		if err := run(context.Background(), append(args, "--config", path), env, io.Discard, io.Discard); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if err := run(context.Background(), []string{"budget", "--json", "--config", path}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var b struct {
		Manual  bool `json:"manual_brake"`
		Engaged bool `json:"brake_engaged"`
	}
	if err := json.Unmarshal(out.Bytes(), &b); err != nil || b.Manual || b.Engaged {
		t.Errorf("budget --json: %s (%v)", out.String(), err)
	}
	backup := filepath.Join(dir, "backup.db")
	if err := run(context.Background(), []string{"backup", backup, "--config", path}, env, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Size() == 0 {
		t.Errorf("backup file: %v", err)
	}
}

// checkInFlightAtShutdown: a request in flight when shutdown starts (by
// cancel, once the upstream holds the call) still completes, and serve
// returns no error.
func checkInFlightAtShutdown(t *testing.T, addr, key string, geminiCalled <-chan struct{}, cancel func(), done <-chan error) {
	// A request in flight when shutdown starts still completes: the stop
	// begins while the upstream holds the call.
	type result struct {
		status int
		body   string
		err    error
	}
	inflight := make(chan result, 1)
	go func() {
		status, body, err := postImage(addr, key, samplePNG(t))
		inflight <- result{status, body, err}
	}()
	select {
	case <-geminiCalled:
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream was never called")
	}
	cancel()
	r := <-inflight
	if r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, `"SN-12345"`) {
		t.Errorf("in-flight request: %+v", r)
	}
	if err := <-done; err != nil {
		t.Errorf("serve returned %v", err)
	}
}

// checkKeysStopped: with the server stopped, keys commands open the
// database directly; the key made while serving is listed, not shown,
// and can be revoked.
func checkKeysStopped(t *testing.T, path, key string) {
	// Stopped: keys commands open the database directly; the read was recorded.
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "list", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "erin") || strings.Contains(out.String(), key) {
		t.Errorf("keys list:\n%s", out.String())
	}
	id := strings.Fields(strings.Split(out.String(), "\n")[1])[0]
	if err := run(context.Background(), []string{"keys", "revoke", id, "--config", path}, envFrom(nil), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	run(context.Background(), []string{"keys", "list", "--config", path}, envFrom(nil), &out, io.Discard)
	if strings.Contains(strings.Split(out.String(), "\n")[1], " - ") {
		t.Errorf("revoked key still shown active:\n%s", out.String())
	}
}

// TestOperatorCommandsStopped runs the operator's commands straight on the
// database, with no server running.
func TestOperatorCommandsStopped(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, fmt.Sprintf("[storage]\npath = %q\n[plans.free]\nmonthly_quota = 10\ndaily_attempts = 3\n[plans.pro]\nmonthly_quota = 99\n", filepath.Join(dir, "bw.db")))
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(args, "--config", path), envFrom(nil), &out, io.Discard)
		return out.String(), err
	}
	if _, err := cmd("keys", "create", "--user", "fay"); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"users", "set-plan", "fay", "pro"}, "plan pro"},
		{[]string{"users", "ban", "fay"}, "banned=true"},
		{[]string{"usage", "fay"}, "fay"},
		{[]string{"usage"}, "READS TODAY BY MODEL"},
		{[]string{"budget"}, "reads today: -"},
		{[]string{"brake", "on"}, "ENGAGED by manual"},
		{[]string{"budget"}, "manual switch on"},
		{[]string{"brake", "off"}, "released"},
	}
	for _, s := range steps {
		out, err := cmd(s.args...)
		if err != nil || !strings.Contains(out, s.want) {
			t.Errorf("%v: %q %v, want %q", s.args, out, err, s.want)
		}
	}
	out, err := cmd("usage", "--json")
	var usage []struct {
		User   string `json:"user"`
		Plan   string `json:"plan"`
		Banned bool   `json:"banned"`
		Quota  int64  `json:"monthly_quota"`
	}
	if err != nil || json.Unmarshal([]byte(out), &usage) != nil || len(usage) != 1 || usage[0].Plan != "pro" || !usage[0].Banned || usage[0].Quota != 99 {
		t.Errorf("usage --json: %s %v", out, err)
	}
	if _, err := cmd("users", "set-plan", "fay", "gold"); err == nil {
		t.Error("set-plan to an unknown plan accepted")
	}
	if _, err := cmd("brake", "maybe"); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("brake maybe: %v", err)
	}
	backup := filepath.Join(dir, "copy.db")
	if _, err := cmd("backup", backup); err != nil {
		t.Fatal(err)
	}
	db, err := storage.Open(backup, storage.Options{})
	if err != nil {
		t.Fatalf("backup does not open: %v", err)
	}
	defer db.Close()
	if u, err := db.User("fay"); err != nil || !u.Banned || u.Plan != "pro" {
		t.Errorf("backup's user %+v %v", u, err)
	}
}

// postImage sends img to addr's /v1/ocr with key. It does not stop the test,
// so goroutines may call it.
func postImage(addr, key string, img []byte) (status int, body string, err error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// slowGemini answers generateContent in the real wire format after hold,
// and reports each call on the returned channel as it starts.
func slowGemini(t *testing.T, hold time.Duration) (*httptest.Server, <-chan struct{}) {
	t.Helper()
	called := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called <- struct{}{}
		time.Sleep(hold)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":298,"candidatesTokenCount":24,"thoughtsTokenCount":0,"totalTokenCount":322},"modelVersion":"gemini-2.5-flash"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, called
}

// samplePNG is a small label-like PNG, like the demo's.
func samplePNG(t *testing.T) []byte {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, 320, 96))
	for y := range 96 {
		for x := range 320 {
			v := uint8(255)
			if (y > 30 && y < 66) && (x/8)%3 == 0 && x > 20 && x < 300 {
				v = 0
			}
			img.SetGray(x, y, color.Gray{Y: v})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

var curlRE = regexp.MustCompile(`(?m)^curl .*Bearer (bw_\w+)'.*--data-binary @(\S+) (http://\S+)$`)

func TestDemoAnswersItsOwnCurl(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, logs := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"demo", "--config", "config.toml"}, envFrom(nil), out, logs) }()
	waitFor(t, out, curlRE)
	m := curlRE.FindStringSubmatch(out.String())
	key, file, url := m[1], m[2], m[3]

	img, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(img))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "image/png")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Serials   []string `json:"serials"`
		Simulated bool     `json:"simulated"`
		Quota     struct{ Used int }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || len(body.Serials) == 0 || !body.Simulated || body.Quota.Used != 1 {
		t.Errorf("demo answered %d %+v", resp.StatusCode, body)
	}
	checkDemoStartLine(t, logs.String())
	cancel()
	if err := <-done; err != nil {
		t.Errorf("demo returned %v", err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("demo left %s behind", file)
	}
}

// checkDemoStartLine: the demo's start line names the simulated
// upstream, and no base URL that the service never calls.
func checkDemoStartLine(t *testing.T, logs string) {
	t.Helper()
	line := regexp.MustCompile(`(?m)^.*msg="starting breakwater".*$`).FindString(logs)
	if !strings.Contains(line, "provider=simulated") || !strings.Contains(line, `base_url="none (simulated)"`) || strings.Contains(line, "googleapis") {
		t.Errorf("the demo's start line names an upstream it never calls:\n%s", line)
	}
}

// TestDemoListensWhereTold: demo --listen and --admin-listen put the
// public API and the dashboard on the addresses given, and its curl line
// names the public one, so a proxy config can name it once.
func TestDemoListensWhereTold(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, adminAddr := freeAddr(t), freeAddr(t)
	out, logs := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--config", "config.toml", "--listen", addr, "--admin-listen", adminAddr}, envFrom(nil), out, logs)
	}()
	waitFor(t, out, regexp.MustCompile(`Press Ctrl\+C`))
	if got, want := curlRE.FindStringSubmatch(out.String())[3], "http://"+addr+"/v1/ocr"; got != want {
		t.Errorf("the curl line sends to %s, want %s", got, want)
	}
	if !strings.Contains(out.String(), "Dashboard: http://"+adminAddr+"/ ") {
		t.Errorf("the dashboard is not at %s:\n%s", adminAddr, out.String())
	}
	if got := waitUp(t, "http://"+addr+"/healthz", done); got != http.StatusOK {
		t.Errorf("GET /healthz on --listen: %d", got)
	}
	if got := waitUp(t, "http://"+adminAddr+"/", done); got != http.StatusUnauthorized {
		t.Errorf("GET / on --admin-listen without the token: %d, want 401", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("demo returned %v", err)
	}
}

// TestHotReload edits config.toml under a running server: a typo is refused
// and the old limits kept; a valid change applies without a restart.
func TestHotReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	base := fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[storage]
path = %q
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
`, filepath.Join(dir, "bw.db"))
	write := func(body string) { t.Helper(); saveAsEditor(t, path, body) }
	write(base + "[limits.user]\nrate = 1\nwindow = \"1h\"\n")

	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "create", "--user", "gus", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	key := lines[len(lines)-1]

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, logs, _ := startApp(t, path, envFrom(nil))
	a.Watch(ctx, path) // as serve does
	addr := a.Addr()
	img := samplePNG(t)
	post := func() int {
		status, _, err := postImage(addr, key, img)
		if err != nil {
			t.Fatal(err)
		}
		return status
	}
	if a, b := post(), post(); a != 200 || b != 429 {
		t.Fatalf("statuses %d, %d; want 200 then 429", a, b)
	}

	write(base + "[limits.user]\nrate = 5\nwindwo = \"1h\"\n")
	waitFor(t, logs, regexp.MustCompile(`config reload refused.*limits.user.windwo`))
	if got := post(); got != 429 {
		t.Errorf("after a typo: %d, want 429 (old limits kept)", got)
	}

	write(strings.Replace(base, `listen = "127.0.0.1:0"`, `listen = "127.0.0.1:1"`, 1) + "[limits.user]\nrate = 5\nwindow = \"1h\"\n" +
		"[detect]\nip_users = 7\nrun_at = \"01:30\"\n")
	waitFor(t, logs, regexp.MustCompile(`msg="config reloaded"`))
	if !strings.Contains(logs.String(), `changed="detect.ip_users detect.run_at limits.user.rate server.listen"`) {
		t.Errorf("the reload does not name the keys that changed:\n%s", logs.String())
	}
	for _, key := range []string{"server.listen", "detect.run_at"} {
		if !strings.Contains(logs.String(), `needs a restart to apply" key=`+key+"\n") {
			t.Errorf("the %s change was not reported as needing a restart:\n%s", key, logs.String())
		}
	}
	if strings.Contains(logs.String(), `needs a restart to apply" key=detect`+"\n") {
		t.Errorf("a detect threshold was reported as needing a restart:\n%s", logs.String())
	}
	if got := post(); got != 200 {
		t.Errorf("after raising the rate: %d, want 200", got)
	}
}

// TestServeWithJWT runs serve with JWT sign-in against a JWKS that is down
// at start: the service starts and says so, and a JWT works once the
// endpoint is back, with no restart.
func TestServeWithJWT(t *testing.T) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := priv.PublicKey.ECDH()
	xy := raw.Bytes()[1:]
	b64 := base64.RawURLEncoding.EncodeToString
	jwks := fmt.Sprintf(`{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","use":"sig","alg":"ES256","x":%q,"y":%q}]}`, b64(xy[:32]), b64(xy[32:]))
	var up atomic.Bool
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, jwks)
	}))
	defer provider.Close()

	dir := t.TempDir()
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[storage]
path = %q
[ocr]
provider = "simulated"
[auth.jwt]
jwks_url = %q
issuer = "https://issuer.example.com"
refresh_interval = "1h"
[plans.free]
monthly_quota = 10
`, filepath.Join(dir, "bw.db"), provider.URL+"/jwks.json"))
	a, logs, _ := startApp(t, path, envFrom(nil))
	addr := a.Addr()
	if !strings.Contains(logs.String(), "no JWKS keys yet") {
		t.Errorf("an unreachable JWKS at start is not logged:\n%s", logs.String())
	}

	up.Store(true)
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{
		"iss": "https://issuer.example.com", "sub": "user_e2e", "exp": time.Now().Add(time.Minute).Unix(),
	})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(samplePNG(t)))
	req.Header.Set("Authorization", "Bearer "+signed)
	req.Header.Set("Content-Type", "image/png")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"used":1`) {
		t.Errorf("JWT once the JWKS is back: %d %s", resp.StatusCode, body)
	}
}

var inviteCodeRE = regexp.MustCompile(`^[2-9A-HJKMNP-Z]{4}-[2-9A-HJKMNP-Z]{4}-[2-9A-HJKMNP-Z]{4}$`)

// TestInvitesCommands manages invites while the server is stopped (the
// database directly) and while it runs (the admin API), and redeems a code
// created through the CLI over HTTP.
func TestInvitesCommands(t *testing.T) {
	dir := t.TempDir()
	adminAddr := freeAddr(t)
	path := operatorConfig(t, adminAddr, filepath.Join(dir, "bw.db"), "")
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "invites-admin-token"})
	invites := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(append([]string{"invites"}, args...), "--config", path), env, &out, io.Discard)
		return out.String(), err
	}
	lastLine := func(out string) string {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return lines[len(lines)-1]
	}

	// A fresh install: invites create makes no database (keys create does).
	if _, err := invites("list"); err == nil || !strings.Contains(err.Error(), "no database at") {
		t.Fatalf("invites list on a fresh install: %v, want no database", err)
	}
	if err := run(context.Background(), []string{"keys", "create", "--user", "setup", "--config", path}, env, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}

	// Stopped: straight to the database.
	out, err := invites("create", "--uses", "2", "--expires", "0", "--note", "first batch")
	if err != nil {
		t.Fatal(err)
	}
	stoppedCode := lastLine(out)
	if !inviteCodeRE.MatchString(stoppedCode) {
		t.Fatalf("last line %q is not a code", stoppedCode)
	}
	out, err = invites("list")
	if err != nil || !strings.Contains(out, "0/2") || !strings.Contains(out, "first batch") || strings.Contains(out, stoppedCode) {
		t.Fatalf("list while stopped: %v\n%s", err, out)
	}

	// Running: through the admin API.
	a, _, stop := startApp(t, path, env)
	addr := a.Addr()
	if a.AdminAddr() != adminAddr {
		t.Fatalf("the admin API listens on %q, want %s", a.AdminAddr(), adminAddr)
	}

	out, err = invites("create")
	if err != nil {
		t.Fatal(err)
	}
	code := lastLine(out)
	if !inviteCodeRE.MatchString(code) || !strings.Contains(out, "1 use(s), expires") {
		t.Fatalf("create while running printed:\n%s", out)
	}
	for _, c := range []string{code, stoppedCode} {
		resp, err := http.Post("http://"+addr+"/v1/invites/verify", "application/json",
			strings.NewReader(fmt.Sprintf(`{"code":%q,"email":"dana@example.com"}`, c)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"valid":true`) {
			t.Errorf("verify %s: %d %s", c, resp.StatusCode, body)
		}
	}
	out, err = invites("list")
	if err != nil || !strings.Contains(out, "1/1") || !strings.Contains(out, "1/2") || strings.Contains(out, code) {
		t.Errorf("list while running: %v\n%s", err, out)
	}
	id := strings.Fields(strings.Split(out, "\n")[2])[0]
	if _, err := invites("revoke", id); err != nil {
		t.Fatal(err)
	}
	if _, err := invites("revoke", "inv_nope"); err == nil {
		t.Error("revoking an unknown invite succeeded")
	}
	// The other invite (the stopped one, used once) is deleted for good.
	other := strings.Fields(strings.Split(out, "\n")[1])[0]
	if other == id {
		other = strings.Fields(strings.Split(out, "\n")[2])[0]
	}
	if out, err := invites("delete", other); err != nil || !strings.Contains(out, "deleted invite "+other) {
		t.Fatalf("delete while running: %v\n%s", err, out)
	}
	stop()

	// Stopped again: the revocation is on disk.
	out, err = invites("list")
	if err != nil || !strings.Contains(strings.Split(out, "\n")[1], id) || strings.Contains(out, other) {
		t.Fatalf("list after stop: %v\n%s", err, out)
	}
	if fields := strings.Fields(strings.Split(out, "\n")[1]); fields[4] == "-" {
		t.Errorf("revoked invite shown active:\n%s", out)
	}
	for _, args := range [][]string{{"invites"}, {"invites", "revoke"}, {"invites", "delete"}, {"invites", "create", "--uses", "0"}, {"invites", "frob"}} {
		if err := run(context.Background(), args, env, io.Discard, io.Discard); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

func TestDetectRunStopped(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "bw.db")
	path := writeConfig(t, fmt.Sprintf(`[storage]
path = %q
[budget]
timezone = "America/New_York"
[detect]
ip_users = 2
[plans.free]
monthly_quota = 10
`, dbPath))
	ny, _ := time.LoadLocation("America/New_York")
	db, err := storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := time.Now().In(ny)
	at := time.Date(l.Year(), l.Month(), l.Day()-2, 12, 0, 0, 0, ny)
	day := at.Format("2006-01-02")
	err = db.AppendEvents([]detect.Event{
		{Time: at, UserID: "ann", IP: "203.0.113.5", Route: "/v1/ocr", Outcome: "ok", CostMicroUSD: 100},
		{Time: at, UserID: "bo\r\nBcc: x@evil.test", IP: "203.0.113.5", Route: "/v1/ocr", Outcome: "upstream_failed"},
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"detect", "run", "--day", day, "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"detection for " + day + ": 2 attempts (1 ok, 1 failed) by 2 users from 1 IPs", "1 findings", "shared_ip", "203.0.113.5", "users=2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("detect run printed:\n%s\nwant %q", out.String(), want)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"detect", "run", "--day", day, "--json", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Day      string `json:"day"`
		Findings []struct{ Detector, Subject string }
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Day != day || len(rep.Findings) != 1 {
		t.Errorf("detect run --json: %s (%v)", out.String(), err)
	}
	db, err = storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if last, err := db.LastDetectRun(); err != nil || last.Day != day {
		t.Errorf("last run %+v %v", last, err)
	}
}

func TestAdminListenNeedsLongTokenOffLoopback(t *testing.T) {
	long := strings.Repeat("t", 32)
	cases := []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8081", "short", true},
		{"[::1]:8081", "short", true},
		{"localhost:8081", "short", true},
		{"0.0.0.0:8081", "short", false},
		{"192.0.2.10:8081", strings.Repeat("t", 31), false},
		{"192.0.2.10:8081", long, true},
		{":8081", "short", false},
		{"0.0.0.0:8081", "", true}, // no token: the admin API does not start at all
	}
	for _, c := range cases {
		if err := app.CheckAdminListen(c.addr, c.token); (err == nil) != c.ok {
			t.Errorf("app.CheckAdminListen(%q, %d chars) = %v, want ok=%v", c.addr, len(c.token), err, c.ok)
		}
	}
	// serve refuses to start such a listener.
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"0.0.0.0:0\"\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 1\n",
		filepath.Join(t.TempDir(), "bw.db")))
	err := run(context.Background(), []string{"serve", "--config", path}, envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "short"}), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "at least 32 characters") {
		t.Errorf("serve with a short token off loopback: %v", err)
	}
}

// TestShutdownOutlastsTheUpstreamCall: a read that starts just before
// SIGTERM may take all of ocr.timeout; shutdown must wait longer than that
// for its record and its answer (it gave 20 s against a 30 s default).
func TestShutdownOutlastsTheUpstreamCall(t *testing.T) {
	for _, timeout := range []time.Duration{0, 5 * time.Second, 90 * time.Second} {
		var c app.Config
		c.OCR.Timeout = timeout
		bound := c.OCR.WithDefaults().Timeout
		if got := app.ShutdownTimeout(c); got <= bound+10*time.Second {
			t.Errorf("ocr.timeout %v: shutdown waits %v, want more than the call plus the record's 10 s", timeout, got)
		}
	}
}

func cwd(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReadmeShowsTheHelp keeps the README's list of commands what
// breakwater help prints.
func TestReadmeShowsTheHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```text\n"+out.String()+"```\n") {
		t.Errorf("docs/OPERATIONS.md does not show breakwater help as it prints:\n%s", out.String())
	}
}

// TestNoCommandServes: "breakwater --config FILE" is "breakwater serve
// --config FILE".
func TestNoCommandServes(t *testing.T) {
	addr := freeAddr(t)
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = %q\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 1\n",
		addr, filepath.Join(t.TempDir(), "bw.db")))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--config", path}, envFrom(nil), io.Discard, io.Discard) }()
	if status := waitUp(t, "http://"+addr+"/healthz", done); status != http.StatusOK {
		t.Errorf("healthz: %d", status)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve returned %v", err)
	}
}

// saveAsEditor writes body to path as many editors save: beside it, then
// renamed over it.
func saveAsEditor(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".swp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// operatorConfig writes a config for a test server that operator commands
// reach: the simulated upstream, a loopback listener, the admin API on
// adminAddr, the database at db and a free plan of 10 reads a month,
// followed by extra.
func operatorConfig(t *testing.T, adminAddr, db, extra string) string {
	t.Helper()
	return writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = %q\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n",
		adminAddr, db)+extra)
}

// cliOn runs the command line with args and --config path in env, and
// returns what it printed on standard output.
func cliOn(path string, env func(string) string) func(args ...string) (string, error) {
	return func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(args, "--config", path), env, &out, io.Discard)
		return out.String(), err
	}
}

// simulatedConfig writes a config for a test server with the simulated
// upstream, loopback listeners and its own database, followed by extra.
func simulatedConfig(t *testing.T, extra string) string {
	t.Helper()
	return writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n",
		filepath.Join(t.TempDir(), "bw.db"))+extra)
}

// TestTOMLSyntaxErrorNamesItsLine: a syntax error in config.toml is
// reported with its line and column by config check and by serve (which
// refuses to start), and by the operator's commands, not as the parser's
// bare "toml: expected character ]".
func TestTOMLSyntaxErrorNamesItsLine(t *testing.T) {
	broken := writeConfig(t, "[server]\nlisten = \"127.0.0.1:0\"\n\n[limits\nrate = 5\n")
	for _, args := range [][]string{
		{"config", "check", "--config", broken},
		{"serve", "--config", broken},
		{"usage", "--config", broken},
	} {
		t.Run(args[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := run(ctx, args, envFrom(map[string]string{"GEMINI_API_KEY": "k"}), io.Discard, io.Discard)
			if err == nil {
				t.Fatal("no error for a broken file")
			}
			if want := "line 4, column 8: toml: expected character ]"; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q, want it to contain %q", err, want)
			}
		})
	}
}

// TestSIGHUPWithTheSameFileChangesNothing: a reload of an unchanged
// config.toml, [[routes]] with [routes.fail] included, logs that no key
// changed; it used to log changed=routes on every reload.
func TestSIGHUPWithTheSameFileChangesNothing(t *testing.T) {
	path := simulatedConfig(t, `[plans.free]
monthly_quota = 100

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
`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, logs, _ := startApp(t, path, envFrom(nil))
	a.Watch(ctx, path) // as serve does
	reloaded := regexp.MustCompile(`msg="config reloaded[^"]*" trigger=SIGHUP.*`)
	for i := range 2 { // the second compares with what the first left running
		before := len(reloaded.FindAllString(logs.String(), -1))
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(reloaded.FindAllString(logs.String(), -1)) == before {
			if time.Now().After(deadline) {
				t.Fatalf("SIGHUP %d: no reload logged:\n%s", i+1, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		lines := reloaded.FindAllString(logs.String(), -1)
		if line := lines[len(lines)-1]; !strings.Contains(line, "no key changed") || strings.Contains(line, "changed=") {
			t.Errorf("SIGHUP %d with the same file logged %q, want no key changed", i+1, line)
		}
	}
}
