package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/server"
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
	c, err := loadConfig("config.toml", envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Plans["free"].MonthlyQuota == 0 || c.OCR.Provider != "gemini" || c.Storage.Path != "data/breakwater.db" {
		t.Errorf("unexpected shipped config: %+v", c)
	}
	// The shipped [invites] spells out the defaults.
	def := server.InviteConfig{}.WithDefaults()
	if c.Invites.Rate != def.Rate || c.Invites.Window != def.Window || c.Invites.Burst != def.Burst ||
		c.Invites.Fail() != def.Fail() {
		t.Errorf("shipped [invites] %+v differs from the defaults %+v", c.Invites, def)
	}
}

func TestInviteConfigDefaultsAndOverrides(t *testing.T) {
	c, err := loadConfig(writeConfig(t, minimalConfig), envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	f := c.Invites.Fail()
	if c.Invites.Rate != 50 || c.Invites.Window != 10*time.Minute || c.Invites.Burst != 3 || f.Limit != 5 ||
		f.Window != 10*time.Minute || f.Cooldown != 10*time.Minute || f.Backoff || f.MaxCooldown != 24*time.Hour ||
		f.Decay || f.GlobalPerHour != 1000 {
		t.Errorf("defaults %+v / %+v", c.Invites, f)
	}
	c, err = loadConfig(writeConfig(t, "[invites]\nreset_on_success = false\nbackoff = true\n"+minimalConfig),
		envFrom(map[string]string{"BREAKWATER_INVITES__FAIL_LIMIT": "7"}))
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Invites.Fail(); !f.Decay || !f.Backoff || f.Limit != 7 {
		t.Errorf("overrides not applied: %+v", f)
	}
	c, err = loadConfig(writeConfig(t, minimalConfig), envFrom(map[string]string{"BREAKWATER_INVITES__RESET_ON_SUCCESS": "false"}))
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
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadConfig(writeConfig(t, c.toml), envFrom(c.env))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one naming %s", err, c.want)
			}
		})
	}
}

func TestConfigEnvironmentTypoIsRefused(t *testing.T) {
	t.Setenv("BREAKWATER_SERVER__MAX_IMAGE_BYTE", "5")
	_, err := loadConfig(writeConfig(t, minimalConfig), os.Getenv)
	if err == nil || !strings.Contains(err.Error(), "BREAKWATER_SERVER__MAX_IMAGE_BYTE") {
		t.Errorf("error %v, want one naming the variable", err)
	}
}

func TestConfigEnvironmentOverrides(t *testing.T) {
	path := writeConfig(t, "[server]\nlisten = \":80\"\n"+minimalConfig)
	c, err := loadConfig(path, envFrom(map[string]string{
		"BREAKWATER_SERVER__LISTEN":                "127.0.0.1:9999",
		"BREAKWATER_SERVER__TRUSTED_PROXIES":       "127.0.0.1, 10.0.0.0/8",
		"BREAKWATER_OCR__TIMEOUT":                  "7s",
		"BREAKWATER_OCR__PRICE__MAX_OUTPUT_TOKENS": "128",
		"BREAKWATER_PLANS__FREE__MONTHLY_QUOTA":    "42",
		"BREAKWATER_ADMIN_TOKEN":                   "not a config key",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Listen != "127.0.0.1:9999" || len(c.Server.TrustedProxies) != 2 || c.OCR.Timeout != 7*time.Second ||
		c.OCR.Price.MaxOutputTokens != 128 || c.Plans["free"].MonthlyQuota != 42 {
		t.Errorf("overrides not applied: %+v", c)
	}
}

func TestConfigCheckCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"config", "check", "--config", writeConfig(t, "[server]\nlisen = 1\n")}, envFrom(nil), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "server.lisen") {
		t.Errorf("config check: %v", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"config", "check", "--config", "config.toml"}, envFrom(nil), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "OK") || !strings.Contains(out.String(), "GEMINI_API_KEY") {
		t.Errorf("config check printed %q", out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"keys"}, {"keys", "create"}, {"keys", "revoke"}, {"config"}, {"serve", "--nope"}} {
		err := run(context.Background(), args, envFrom(nil), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "usage") {
			t.Errorf("%v: %v, want a usage error", args, err)
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

var listenRE = regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)

// TestServeEndToEnd runs the real binary's run: serve, keys through the
// admin API while serving, a request in flight at shutdown, keys directly on
// the database once stopped.
func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	adminAddr := freeAddr(t)
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
admin_listen = %q
[storage]
path = %q
[ocr]
provider = "simulated"
simulated_latency = "700ms"
[plans.free]
monthly_quota = 10
`, adminAddr, filepath.Join(dir, "data", "bw.db")))
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "e2e-admin-token"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--config", path}, env, io.Discard, logs) }()
	addr := waitFor(t, logs, listenRE)
	waitFor(t, logs, regexp.MustCompile(`listener=admin`))

	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()

	// A second server on the same database is refused at once.
	err = run(context.Background(), []string{"serve", "--config", path}, env, io.Discard, io.Discard)
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

	// A request in flight when shutdown starts still completes.
	img, err := os.ReadFile(filepath.Join("server", "testdata", "label.png"))
	if err != nil {
		img = samplePNG(t)
	}
	type result struct {
		status int
		body   string
		err    error
	}
	inflight := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "image/png")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			inflight <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		inflight <- result{status: resp.StatusCode, body: string(b)}
	}()
	time.Sleep(200 * time.Millisecond) // the request is now inside the 700 ms simulated read
	cancel()
	r := <-inflight
	if r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, `"simulated":true`) {
		t.Errorf("in-flight request: %+v", r)
	}
	if err := <-done; err != nil {
		t.Errorf("serve returned %v", err)
	}

	// Stopped: keys commands open the database directly; the read was recorded.
	out.Reset()
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

func samplePNG(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s.png")
	if err := writeSampleImage(p); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
	cancel()
	if err := <-done; err != nil {
		t.Errorf("demo returned %v", err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("demo left %s behind", file)
	}
}

var inviteCodeRE = regexp.MustCompile(`^[2-9A-HJKMNP-Z]{4}-[2-9A-HJKMNP-Z]{4}-[2-9A-HJKMNP-Z]{4}$`)

// TestInvitesCommands manages invites while the server is stopped (the
// database directly) and while it runs (the admin API), and redeems a code
// created through the CLI over HTTP.
func TestInvitesCommands(t *testing.T) {
	dir := t.TempDir()
	adminAddr := freeAddr(t)
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
admin_listen = %q
[storage]
path = %q
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 10
`, adminAddr, filepath.Join(dir, "bw.db")))
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--config", path}, env, io.Discard, logs) }()
	addr := waitFor(t, logs, listenRE)
	waitFor(t, logs, regexp.MustCompile(`listener=admin`))

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
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}

	// Stopped again: the revocation is on disk.
	out, err = invites("list")
	if err != nil || !strings.Contains(strings.Split(out, "\n")[2], id) {
		t.Fatalf("list after stop: %v\n%s", err, out)
	}
	if fields := strings.Fields(strings.Split(out, "\n")[2]); fields[4] == "-" {
		t.Errorf("revoked invite shown active:\n%s", out)
	}
	for _, args := range [][]string{{"invites"}, {"invites", "revoke"}, {"invites", "create", "--uses", "0"}, {"invites", "frob"}} {
		if err := run(context.Background(), args, env, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "usage") {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
