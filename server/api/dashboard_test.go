package api

import (
	"bytes"
	"context"
	"flag"
	"image/png"
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
	"breakwater/server/admin"
	"breakwater/server/edge"
	"breakwater/server/edgetest"
	"breakwater/server/operator"
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
	d, err := e.adm.Dashboard(context.Background(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if d.Budget.Requests != 4 || d.Budget.DailyRequests != 500 || d.Budget.DailyUSD != 2 || d.Budget.Engaged {
		t.Errorf("budget %+v", d.Budget)
	}
	if len(d.TopUsers) != 2 || d.TopUsers[0].User != "alice" || d.TopUsers[0].AttemptsToday != 3 || d.TopUsers[1].User != "bob" {
		t.Errorf("top users %+v", d.TopUsers)
	}
	if len(d.Refusals) != 1 || d.Refusals[0] != (edge.RefusalCount{Layer: "rate", Reason: "rate", Count: 1}) {
		t.Errorf("refusals %+v", d.Refusals)
	}
	if len(d.Days) != 1 || d.Days[0].Requests != 4 {
		t.Errorf("days %+v", d.Days)
	}
	if n := strings.Count(string(d.Chart), `class="bar"`); n != 30 {
		t.Errorf("%d bars, want 30", n)
	}
	// One day of data: 4 calls, so the calls axis tops at 4 with 2 at
	// half; the zero line, units and a dot for the one day that cost.
	for _, want := range []string{`id="zero-line"`, ">calls per day<", ">cost per day (US$)<", ">day (month-day, UTC)<",
		`class="axis-calls" x="58" y="32.0" text-anchor="end">4<`, `class="axis-calls" x="58" y="130.0" text-anchor="end">2<`,
		`text-anchor="end">0<`, ">$0<", "<circle "} {
		if !strings.Contains(string(d.Chart), want) {
			t.Errorf("the chart lacks %s:\n%s", want, d.Chart)
		}
	}
}

// The would-be refusals in shadow mode show per layer, read from the
// recorded events as breakwater usage reads them: live (the minute the
// recorder still counts in memory) and the same after a restart.
func TestDashboardShowsShadowRefusals(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOptions{dir: dir, attempts: 10, limits: limiter.Config{Rate: 1, Window: time.Hour}})
	e.srv.d.Operator.SetPendingEvents(e.events)
	e.srv.SetShadow(true)
	for range 3 {
		e.post(e.key, "image/png", pngBytes(t, 16, 16))
	}
	check := func(when string, e *env) {
		t.Helper()
		d, err := e.adm.Dashboard(context.Background(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Refusals) != 0 || len(d.Shadow) != 1 || d.Shadow[0] != (admin.ShadowRow{Layer: "rate", Count: 2}) {
			t.Errorf("%s: refusals %+v, shadow %+v; want 2 in shadow mode at layer rate and none refused", when, d.Refusals, d.Shadow)
		}
	}
	// The events reach the recorder's count through its queue, a moment
	// after the answers.
	edgetest.WaitFor(t, "the recorder to count the shadowed refusals", func() bool {
		d, err := e.adm.Dashboard(context.Background(), time.Now())
		return err == nil && len(d.Shadow) == 1 && d.Shadow[0].Count >= 2
	})
	check("live", e)
	e.http.Close()
	e.admin.Close()
	e.events.Close(context.Background())
	e.db.Close()
	check("after a restart", newEnv(t, envOptions{dir: dir}))
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
	checkDashboardFigures(t, e, string(out))
	checkDashboardScreenshot(t, ctx, bin, url)
}

// checkDashboardFigures checks the figures of the page Chromium rendered,
// dom, against the database.
func checkDashboardFigures(t *testing.T, e *env, dom string) {
	// Until the brake gives its lease back, today's ledger also holds the
	// lease's unused calls; the page shows the calls made.
	if err := e.brake.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
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
	if got, want := text("spend-today"), operator.FormatUSD(float64(day.SpendMicroUSD)/1e6); got != want {
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
	if !strings.Contains(dom, `id="brake-button"`) || !strings.Contains(dom, "Engage the brake") {
		t.Error("the brake button is missing")
	}
}

// checkDashboardScreenshot takes a screenshot of the page at url, for a
// person to judge (-dashboard.screenshot=FILE keeps it); here it checks
// only that Chromium drew a page of that size with the chart's colours in
// it.
func checkDashboardScreenshot(t *testing.T, ctx context.Context, bin, url string) {
	shot := filepath.Join(t.TempDir(), "dashboard.png")
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--hide-scrollbars",
		"--user-data-dir="+filepath.Join(t.TempDir(), "profile"), "--window-size=1024,1500", "--screenshot="+shot, url)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium screenshot: %v\n%s", err, out)
	}
	data, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	if *screenshotTo != "" {
		if err := os.WriteFile(*screenshotTo, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the screenshot is no PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1024 || b.Dy() != 1500 {
		t.Errorf("screenshot %v, want 1024×1500", b)
	}
	var bars, line int
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			switch [3]uint32{r >> 8, g >> 8, b >> 8} {
			case [3]uint32{0x7a, 0xa2, 0xe3}:
				bars++
			case [3]uint32{0xd9, 0x53, 0x4f}:
				line++
			}
		}
	}
	if bars < 100 || line < 20 {
		t.Errorf("the screenshot shows %d pixels of bars and %d of the cost line: is the chart drawn?", bars, line)
	}
}

var screenshotTo = flag.String("dashboard.screenshot", "", "write the dashboard's Chromium screenshot to this file")
