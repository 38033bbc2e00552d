package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"breakwater/budget"
	"breakwater/server/api"
	"breakwater/server/app"
	"breakwater/server/operator"
)

// A config that leaves every limit out must run with the documented
// defaults, never with the limits off: the review's minimal config passed
// config check and let one key make 6,000 calls in six seconds.
func TestMinimalConfigKeepsTheDocumentedLimits(t *testing.T) {
	path := simulatedConfig(t, "[plans.free]\nmonthly_quota = 1000\n")
	c, err := app.Load(path, envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Budget, budget.DefaultConfig(); got != want {
		t.Errorf("budget = %+v, want the defaults %+v", got, want)
	}
	if got, want := c.Limits.User, api.DefaultUserLimits(); got != want {
		t.Errorf("limits.user = %+v, want the defaults %+v", got, want)
	}
	if got, want := c.Plans["free"].DailyAttempts, int64(500); got != want {
		t.Errorf("plans.free.daily_attempts = %d, want %d (half the monthly quota)", got, want)
	}

	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "limit off") {
		t.Errorf("config check warns of a limit off:\n%s", out.String())
	}

	// What the operator sees: every ceiling at its default, none "off".
	if err := run(context.Background(), []string{"keys", "create", "--user", "ann", "--config", path}, envFrom(nil), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"budget", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"5000", "$10.00", "$100.00"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("budget does not show %s:\n%s", want, out.String())
		}
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if (strings.HasPrefix(l, "requests") || strings.HasPrefix(l, "usd")) && strings.HasSuffix(l, "off") {
			t.Errorf("budget shows a ceiling off: %q", l)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"usage", "ann", "--json", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var usage []operator.UsageInfo
	if err := json.Unmarshal(out.Bytes(), &usage); err != nil || len(usage) != 1 || usage[0].DailyLine != 500 {
		t.Errorf("usage ann: %s %v, want daily line 500", out.String(), err)
	}

	// And what a client meets: the default burst (5 a second) refuses a
	// volley of 20 at once.
	key := createKey(t, path, "bob")
	a, logs, _ := startApp(t, path, envFrom(nil))
	addr := a.Addr()
	if strings.Contains(logs.String(), "LIMIT OFF") {
		t.Errorf("serve warns of a limit off:\n%s", logs.String())
	}
	img := samplePNG(t)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			status, _, err := postImage(addr, key, img)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			codes[status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusOK] > api.DefaultUserBurst || codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("20 requests at once: %v, want at most %d 200s and the rest 429", codes, api.DefaultUserBurst)
	}
}

// createKey makes an API key for user with the server stopped, and
// returns it.
func createKey(t *testing.T, path, user string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "create", "--user", user, "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return lines[len(lines)-1]
}

// An explicit 0 still switches a limit off, and both serve and config
// check say so, naming the key; so does a 0 from the environment.
func TestExplicitZeroWarnsNamingTheKey(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[storage]
path = %q
[ocr]
provider = "simulated"
[budget]
daily_requests = 0
[limits.user]
rate = 0
[plans.free]
monthly_quota = 10
daily_attempts = 0
[plans.pro]
monthly_quota = 100
`, filepath.Join(dir, "bw.db")))
	env := envFrom(map[string]string{"BREAKWATER_BUDGET__MONTHLY_USD": "0"})
	want := []string{"budget.daily_requests = 0", "budget.monthly_usd = 0", "limits.user.rate = 0", "plans.free.daily_attempts = 0"}
	notWant := []string{"budget.daily_usd", "limits.user.burst", "plans.pro.daily_attempts"}

	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "--config", path}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	check := func(what, text string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not warn about %q:\n%s", what, w, text)
			}
		}
		// The note on money keys left to their defaults names them on
		// purpose (a running server that set them refuses to lose them).
		var warnings []string
		for _, l := range strings.Split(text, "\n") {
			if !strings.HasPrefix(l, "note: this file leaves money keys") {
				warnings = append(warnings, l)
			}
		}
		for _, w := range notWant {
			if strings.Contains(strings.Join(warnings, "\n"), w) {
				t.Errorf("%s warns about %q, which is at its default:\n%s", what, w, text)
			}
		}
	}
	check("config check", out.String())

	_, logs, stop := startApp(t, path, env)
	stop()
	var warned strings.Builder
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "LIMIT OFF") {
			warned.WriteString(l + "\n")
		}
	}
	check("serve's log", warned.String())
}
