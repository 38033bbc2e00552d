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
	c, err := loadConfig("config.toml", envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Plans["free"].MonthlyQuota == 0 || c.OCR.Provider != "gemini" || c.Storage.Path != "data/breakwater.db" {
		t.Errorf("unexpected shipped config: %+v", c)
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

	// detect run while serving goes through POST /api/detect/run.
	out.Reset()
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

	// Operator commands through the admin API while serving.
	for _, args := range [][]string{{"users", "ban", "erin"}, {"users", "unban", "erin"}, {"brake", "on"}, {"brake", "off"}} {
		if err := run(context.Background(), append(args, "--config", path), env, io.Discard, io.Discard); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	out.Reset()
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
	if _, err := cmd("brake", "maybe"); err == nil || !strings.Contains(err.Error(), "usage") {
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
	write := func(body string) {
		t.Helper()
		// Written beside and renamed over, as many editors save.
		tmp := path + ".swp"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(base + "[limits.user]\nrate = 1\nwindow = \"1h\"\n")

	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "create", "--user", "gus", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	key := lines[len(lines)-1]

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &lockedBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--config", path}, envFrom(nil), io.Discard, logs) }()
	addr := waitFor(t, logs, listenRE)
	img := samplePNG(t)
	post := func() int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ocr", bytes.NewReader(img))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "image/png")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b := post(), post(); a != 200 || b != 429 {
		t.Fatalf("statuses %d, %d; want 200 then 429", a, b)
	}

	write(base + "[limits.user]\nrate = 5\nwindwo = \"1h\"\n")
	waitFor(t, logs, regexp.MustCompile(`config reload refused.*limits.user.windwo`))
	if got := post(); got != 429 {
		t.Errorf("after a typo: %d, want 429 (old limits kept)", got)
	}

	write(strings.Replace(base, `listen = "127.0.0.1:0"`, `listen = "127.0.0.1:1"`, 1) + "[limits.user]\nrate = 5\nwindow = \"1h\"\n")
	waitFor(t, logs, regexp.MustCompile(`msg="config reloaded"`))
	if !strings.Contains(logs.String(), `needs a restart to apply" key=server`) {
		t.Errorf("the listen change was not reported as needing a restart:\n%s", logs.String())
	}
	if got := post(); got != 200 {
		t.Errorf("after raising the rate: %d, want 200", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
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
	err = db.AppendEvents([]storage.Event{
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
