package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/limiter"
)

// dashboardEnv is a service with a day of traffic: successes, a rate-limit
// refusal and a budget ledger.
func dashboardEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, envOptions{
		attempts: 10,
		limits:   limiter.Config{Rate: 3, Window: time.Hour},
		budget:   budget.Config{DailyRequests: 500, DailyUSD: 2, MonthlyUSD: 40},
	})
	bob := e.newKey("bob", "")
	for range 4 { // the fourth is refused by the rate limit
		e.post(e.key, "image/png", pngBytes(t, 16, 16))
	}
	e.post(bob, "image/png", pngBytes(t, 16, 16))
	return e
}

func TestDashboardData(t *testing.T) {
	e := dashboardEnv(t)
	d, err := e.srv.dashboard(context.Background(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if d.Budget.Requests != 4 || d.Budget.DailyRequests != 500 || d.Budget.DailyUSD != 2 || d.Budget.Engaged {
		t.Errorf("budget %+v", d.Budget)
	}
	if len(d.TopUsers) != 2 || d.TopUsers[0].User != "alice" || d.TopUsers[0].AttemptsToday != 3 || d.TopUsers[1].User != "bob" {
		t.Errorf("top users %+v", d.TopUsers)
	}
	if len(d.Refusals) != 1 || d.Refusals[0] != (refusalCount{Layer: "rate", Reason: "rate", Count: 1}) {
		t.Errorf("refusals %+v", d.Refusals)
	}
	if len(d.Days) != 1 || d.Days[0].Requests != 4 {
		t.Errorf("days %+v", d.Days)
	}
	if n := strings.Count(string(d.Chart), `class="bar"`); n != 30 {
		t.Errorf("%d bars, want 30", n)
	}
}

// Shadow refusals show beside the real ones, per layer and reason.
func TestDashboardShowsShadowRefusals(t *testing.T) {
	e := newEnv(t, envOptions{attempts: 10, limits: limiter.Config{Rate: 1, Window: time.Hour}})
	e.srv.SetShadow(true)
	for range 3 {
		e.post(e.key, "image/png", pngBytes(t, 16, 16))
	}
	d, err := e.srv.dashboard(context.Background(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Refusals) != 1 || d.Refusals[0] != (refusalCount{Layer: "rate", Reason: "rate", Shadow: 2}) {
		t.Errorf("refusals %+v, want 2 in shadow mode and none refused", d.Refusals)
	}
}

func TestDashboardNeedsToken(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp, _ := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", ""))
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("no token: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	req := mustRequest(t, http.MethodGet, e.admin.URL+"/", "")
	req.SetBasicAuth("admin", "wrong")
	if resp, _ := do(t, req); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong password: %d", resp.StatusCode)
	}
	req.SetBasicAuth("admin", testAdminToken)
	resp, body := do(t, req)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<svg") {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}

// TestDashboardInChromium loads the dashboard in real headless Chromium
// (Debian's chromium; .ci/run installs it) with the admin token, and checks
// that the figures it renders match the database.
func TestDashboardInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("this test needs Debian's chromium (apt-get install chromium); .ci/run installs it")
	}
	e := dashboardEnv(t)
	url := strings.Replace(e.admin.URL, "http://", "http://admin:"+testAdminToken+"@", 1) + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
		"--user-data-dir="+filepath.Join(t.TempDir(), "profile"), "--dump-dom", url)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	dom := string(out)

	day, err := e.db.Budget(budget.DayKey(time.Now(), time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	text := func(id string) string {
		m := regexp.MustCompile(`id="` + id + `"[^>]*>([^<]*)<`).FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no #%s in the page Chromium rendered:\n%s", id, dom)
		}
		return strings.TrimSpace(m[1])
	}
	if got, want := text("requests-today"), strconv.FormatInt(day.Requests, 10); got != want {
		t.Errorf("calls today shown %q, database %s", got, want)
	}
	if got, want := text("spend-today"), fmt.Sprintf("$%.4f", float64(day.SpendMicroUSD)/1e6); got != want {
		t.Errorf("spend today shown %q, database %s", got, want)
	}
	if got := text("brake-state"); got != "released" {
		t.Errorf("brake shown %q", got)
	}
	if got := text("daily-requests"); got != "500" {
		t.Errorf("ceiling shown %q", got)
	}
	bar := regexp.MustCompile(`data-day="` + budget.DayKey(time.Now(), time.UTC) + `" data-requests="(\d+)"`).FindStringSubmatch(dom)
	if bar == nil || bar[1] != strconv.FormatInt(day.Requests, 10) {
		t.Errorf("today's bar %v, database %d", bar, day.Requests)
	}
	if !strings.Contains(dom, "<td>alice</td>") || !strings.Contains(dom, "<td>bob</td>") {
		t.Error("the top users are missing")
	}
}
