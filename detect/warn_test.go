package detect_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/mail"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/detect/smtptest"
	"breakwater/storage"
)

var update = flag.Bool("update", false, "rewrite the golden mails in testdata")

// hook keeps the notices the Alerter hands it.
type hook struct {
	mu      sync.Mutex
	notices []detect.Notice
}

func (h *hook) Notify(n detect.Notice) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notices = append(h.notices, n)
	return true
}

func (h *hook) kinds() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, n := range h.notices {
		out = append(out, n.Kind)
	}
	return out
}

// budgetFigures is what the Warner reads; the test sets it.
type budgetFigures struct {
	mu sync.Mutex
	f  detect.BudgetFigures
}

func (b *budgetFigures) get(now time.Time) detect.BudgetFigures {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.f
	f.Day, f.Month = now.UTC().Format("2006-01-02"), now.UTC().Format("2006-01")
	return f
}

func (b *budgetFigures) set(fn func(f *detect.BudgetFigures)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fn(&b.f)
}

func startWarner(t *testing.T, db *storage.DB, c *clock, h *hook, mail detect.Sender, figures *budgetFigures) (*detect.Alerter, *detect.Warner) {
	t.Helper()
	a, err := detect.NewAlerter(db, detect.AlerterOptions{Location: time.UTC, Mail: mail, Hooks: []detect.Notifier{h}, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	w, err := detect.NewWarner(a, figures.get, detect.WarnerOptions{Location: time.UTC, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return a, w
}

func TestEarlyWarningsOncePerShareAcrossRestarts(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	figures := &budgetFigures{f: detect.BudgetFigures{DailyRequests: 1000, DailyMicroUSD: 10e6, MonthlyMicroUSD: 100e6}}
	h := &hook{}
	step := func(w *detect.Warner, fn func(f *detect.BudgetFigures)) {
		c.add(time.Minute)
		figures.set(fn)
		w.Check(c.now())
	}
	a, w := startWarner(t, db, c, h, nil, figures)
	step(w, func(f *detect.BudgetFigures) { f.Calls = 499 })
	step(w, func(f *detect.BudgetFigures) { f.Calls = 500 }) // 50%
	step(w, func(f *detect.BudgetFigures) { f.Calls = 700 })
	step(w, func(f *detect.BudgetFigures) { f.Calls = 800 }) // 80%
	step(w, func(f *detect.BudgetFigures) { f.Calls = 810 })
	// Today's spend jumps past 50% and 80% at once: one warning, of 80%.
	step(w, func(f *detect.BudgetFigures) { f.DayMicroUSD = 8.5e6; f.MonthMicroUSD = 8.5e6 })
	closeAlerter(t, a)
	want := []string{"budget_warn_daily_requests_50", "budget_warn_daily_requests_80", "budget_warn_daily_usd_80"}
	if got := h.kinds(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("warnings %v, want %v", got, want)
	}

	// A restart: nothing already sent is sent again, the next share is.
	h = &hook{}
	a, w = startWarner(t, db, c, h, nil, figures)
	step(w, func(f *detect.BudgetFigures) { f.Calls = 820; f.DayMicroUSD = 8.6e6 })
	step(w, func(f *detect.BudgetFigures) { f.Calls = 950; f.MonthMicroUSD = 50e6 }) // 95% of calls, 50% of the month
	step(w, func(f *detect.BudgetFigures) { f.Calls = 990 })
	// The next day re-arms the daily ceilings, not the month's.
	c.add(24 * time.Hour)
	step(w, func(f *detect.BudgetFigures) { f.Calls = 500; f.DayMicroUSD = 0; f.MonthMicroUSD = 60e6 })
	closeAlerter(t, a)
	want = []string{"budget_warn_daily_requests_95", "budget_warn_monthly_usd_50", "budget_warn_daily_requests_50"}
	if got := h.kinds(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after the restart, warnings %v, want %v", got, want)
	}
}

func TestEarlyWarningsOff(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	figures := &budgetFigures{f: detect.BudgetFigures{Calls: 999, DailyRequests: 1000}}
	h := &hook{}
	a, err := detect.NewAlerter(db, detect.AlerterOptions{Location: time.UTC, Hooks: []detect.Notifier{h}, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	w, err := detect.NewWarner(a, figures.get, detect.WarnerOptions{Shares: []float64{}, Location: time.UTC, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Run(ctx) // returns at once: nothing to watch
	closeAlerter(t, a)
	if got := h.kinds(); len(got) != 0 {
		t.Errorf("warn_at = [] sent %v", got)
	}
}

// testMailer is a Mailer to an smtptest server on 127.0.0.1.
func testMailer(t *testing.T) (*detect.Mailer, *smtptest.Server) {
	t.Helper()
	srv := smtptest.Start(t, "127.0.0.1:0")
	host, p, _ := net.SplitHostPort(srv.Addr)
	port, _ := strconv.Atoi(p)
	m, err := detect.NewMailer(detect.AlertsConfig{SMTPHost: host, SMTPPort: port, TLS: "none",
		From: "breakwater@example.com", To: []string{"ops@example.com"}}, detect.MailerOptions{RetryBase: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return m, srv
}

// decode parses a received mail: its subject and its body as a reader
// sees it, with LF line ends. It requires plain 8-bit UTF-8 text.
func decode(t *testing.T, m smtptest.Message) (subject, body string) {
	t.Helper()
	msg, err := mail.ReadMessage(strings.NewReader(m.Data))
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get("Content-Transfer-Encoding"); got != "8bit" {
		t.Errorf("Content-Transfer-Encoding %q, want 8bit", got)
	}
	if got := msg.Header.Get("Content-Type"); !strings.Contains(got, "text/plain") || !strings.Contains(strings.ToLower(got), "utf-8") {
		t.Errorf("Content-Type %q, want UTF-8 plain text", got)
	}
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := msg.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return msg.Header.Get("Subject"), strings.ReplaceAll(b.String(), "\r\n", "\n")
}

// golden compares got with testdata/name (rewritten with -update), and
// requires docs/OPERATIONS.md to show the same text.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "OPERATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), string(want)) {
		t.Errorf("docs/OPERATIONS.md does not show the text of %s:\n%s", path, want)
	}
}

func TestEarlyWarningMail(t *testing.T) {
	db := mustOpen(t)
	m, srv := testMailer(t)
	c := &clock{t: time.Date(2026, 3, 4, 9, 0, 0, 0, time.UTC)}
	figures := &budgetFigures{f: detect.BudgetFigures{Calls: 300, DailyRequests: 1000, DailyMicroUSD: 10e6, MonthlyMicroUSD: 100e6}}
	a, w := startWarner(t, db, c, &hook{}, m, figures)
	w.Check(c.now())
	c.add(time.Hour)
	figures.set(func(f *detect.BudgetFigures) { f.Calls = 500 })
	w.Check(c.now())
	closeAlerter(t, a)
	subject, body := decode(t, srv.WaitFor(t, 1, 10*time.Second)[0])
	if want := "[breakwater] alert: budget warn daily requests 50"; subject != want {
		t.Errorf("subject %q, want %q", subject, want)
	}
	golden(t, "warn_daily_requests.txt", body)
}

func TestBrakeMail(t *testing.T) {
	for _, tc := range []struct{ ceiling, file string }{
		{"daily_usd", "brake_daily_usd.txt"},
		{"daily_requests", "brake_daily_requests.txt"},
	} {
		t.Run(tc.ceiling, func(t *testing.T) {
			db := mustOpen(t)
			m, srv := testMailer(t)
			c := &clock{t: time.Date(2026, 3, 4, 15, 4, 5, 0, time.UTC)}
			a := newAlerter(t, db, c, m)
			f := detect.BudgetFigures{Calls: 5000, DayMicroUSD: 9_999_000, MonthMicroUSD: 42_500_000,
				DailyRequests: 5000, DailyMicroUSD: 10e6, MonthlyMicroUSD: 100e6}
			summary, details := detect.BrakeAlert(tc.ceiling, f, c.now(), time.UTC)
			a.Alert(detect.KindBrakeEngaged, summary, details)
			closeAlerter(t, a)
			subject, body := decode(t, srv.WaitFor(t, 1, 10*time.Second)[0])
			if want := "[breakwater] alert: brake engaged"; subject != want {
				t.Errorf("subject %q, want %q", subject, want)
			}
			golden(t, tc.file, body)
		})
	}
}

func TestDigestMail(t *testing.T) {
	m, srv := testMailer(t)
	rep := detect.Report{Day: "2026-03-03",
		Service: detect.ServiceDay{Attempts: 1, Successes: 1, Users: 1, IPs: 1, CostMicroUSD: 390, Invites: 0},
		Findings: []detect.Finding{{Day: "2026-03-03", Detector: detect.DetectorSharedIP, Subject: "192.0.2.7",
			Figures: map[string]float64{"users": 12, "attempts": 40},
			Users:   []string{"ana", "björn", "chloé", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}}},
	}
	m.Send("detection digest for 2026-03-03: 1 finding", detect.DigestBody(rep))
	subject, body := decode(t, srv.WaitFor(t, 1, 10*time.Second)[0])
	if want := "[breakwater] detection digest for 2026-03-03: 1 finding"; subject != want {
		t.Errorf("subject %q, want %q", subject, want)
	}
	if strings.Contains(body, "=3D") || strings.Contains(body, "=\n") {
		t.Errorf("the body is quoted-printable:\n%s", body)
	}
	golden(t, "digest.txt", body)
}

// The manual switch has no value and no reopening time: the alert says
// how to release it, and gives the day's figures.
func TestBrakeAlertOfTheManualSwitch(t *testing.T) {
	f := detect.BudgetFigures{Calls: 12, DayMicroUSD: 40_000, MonthMicroUSD: 1_250_000}
	summary, details := detect.BrakeAlert("manual", f, time.Date(2026, 3, 4, 15, 0, 0, 0, time.UTC), time.UTC)
	if !strings.Contains(summary, "manual switch") {
		t.Errorf("summary %q", summary)
	}
	for k, want := range map[string]string{
		"ceiling":    "manual (breakwater brake on)",
		"count":      "12 calls and $0.04 today, $1.25 this month",
		"reopens at": "when the operator releases it: breakwater brake off",
	} {
		if got := details[k]; got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
}

// Raising a ceiling, as a warning advises, re-arms the shares the figure
// is now below, also across a restart; the ones it still reaches are not
// sent again.
func TestEarlyWarningsRearmedByARaisedCeiling(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	figures := &budgetFigures{f: detect.BudgetFigures{DayMicroUSD: 8e6, DailyMicroUSD: 10e6}}
	h := &hook{}
	a, w := startWarner(t, db, c, h, nil, figures)
	w.Check(c.now()) // 80% of $10: one warning, 50% covered
	c.add(time.Minute)
	figures.set(func(f *detect.BudgetFigures) { f.DailyMicroUSD = 20e6 }) // raised: now 40%
	w.Check(c.now())
	closeAlerter(t, a)
	if got := strings.Join(h.kinds(), " "); got != "budget_warn_daily_usd_80" {
		t.Fatalf("warnings %s, want the 80%% one only", got)
	}
	h = &hook{}
	a, w = startWarner(t, db, c, h, nil, figures) // a restart keeps the re-arming
	c.add(time.Minute)
	figures.set(func(f *detect.BudgetFigures) { f.DayMicroUSD = 10e6 }) // 50% of $20
	w.Check(c.now())
	c.add(time.Minute)
	figures.set(func(f *detect.BudgetFigures) { f.DayMicroUSD = 16e6 }) // 80% of $20
	w.Check(c.now())
	closeAlerter(t, a)
	if got := strings.Join(h.kinds(), " "); got != "budget_warn_daily_usd_50 budget_warn_daily_usd_80" {
		t.Errorf("after raising the ceiling, warnings %s, want 50%% and 80%% again", got)
	}
	for _, st := range a.Recent() {
		if st.SentAt.IsZero() {
			t.Errorf("Recent lists a re-armed kind %s", st.Kind)
		}
	}
}

// startCrossingWarner is an Alerter and a Warner of 50% and 80%, the
// brake's shares as it tells them (Observe), with the poll reading figures.
func startCrossingWarner(t *testing.T, db *storage.DB, c *clock, h *hook, figures *budgetFigures) (*detect.Alerter, *detect.Warner) {
	t.Helper()
	a, err := detect.NewAlerter(db, detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Hooks: []detect.Notifier{h}, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	w, err := detect.NewWarner(a, figures.get, detect.WarnerOptions{Shares: []float64{0.8, 0.5}, Location: time.UTC, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(w.Percents()); got != "[50 80]" {
		t.Errorf("Percents %s, want [50 80]", got)
	}
	return a, w
}

// The brake tells the Warner of each crossing as it happens (Observe): the
// 50% and 80% warnings are queued in that order before the brake's alert
// raised after them, each once, whatever the brake or the poll tells again
// in the period, and across a restart; the next day warns again.
func TestEarlyWarningsObservedAtTheCrossing(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	at := func(calls int64) detect.BudgetFigures {
		now := c.now()
		return detect.BudgetFigures{Day: now.Format("2006-01-02"), Month: now.Format("2006-01"), Calls: calls, DailyRequests: 20}
	}
	figures := &budgetFigures{f: detect.BudgetFigures{Calls: 20, DailyRequests: 20}}
	h := &hook{}
	a, w := startCrossingWarner(t, db, c, h, figures)
	w.Observe(at(10))
	w.Observe(at(16))
	a.Alert(detect.KindBrakeEngaged, "the brake", nil)
	w.Observe(at(20)) // told again: a new ceiling, a refresh
	w.Check(c.now())  // the poll finds them too
	closeAlerter(t, a)
	want := "budget_warn_daily_requests_50 budget_warn_daily_requests_80 brake_engaged"
	if got := strings.Join(h.kinds(), " "); got != want {
		t.Fatalf("sent %s, want %s", got, want)
	}
	h.mu.Lock()
	if d := h.notices[1].Details; !strings.HasPrefix(d["figure"], "16 calls (80.0%), calls in flight included") {
		t.Errorf("the 80%% warning's figure %q, want the calls counted, in flight included", d["figure"])
	}
	h.mu.Unlock()

	h = &hook{}
	a, w = startCrossingWarner(t, db, c, h, figures) // a restart
	w.Observe(at(20))
	w.Check(c.now())
	c.add(24 * time.Hour)
	w.Observe(at(11))
	closeAlerter(t, a)
	if got := strings.Join(h.kinds(), " "); got != "budget_warn_daily_requests_50" {
		t.Errorf("after the restart, sent %s, want only the next day's 50%%", got)
	}
}

// A warning made when the figure is already at its ceiling (a jump past
// the share, a lowered ceiling) says so, rather than "reached at: reached".
func TestEarlyWarningAtTheCeiling(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	h := &hook{}
	a, w := startCrossingWarner(t, db, c, h, &budgetFigures{})
	w.Observe(detect.BudgetFigures{Day: "2026-03-04", Month: "2026-03", DayMicroUSD: 10e6, DailyMicroUSD: 10e6})
	closeAlerter(t, a)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.notices) != 1 {
		t.Fatalf("notices %v, want one", h.notices)
	}
	d := h.notices[0].Details
	if got, want := d["reached at"], "already: the brake refuses the calls that do not fit until it resets"; got != want {
		t.Errorf("reached at: %q, want %q", got, want)
	}
	if got := d["figure"]; !strings.Contains(got, "calls in flight counted at their worst case") {
		t.Errorf("figure %q does not say that calls in flight count at their worst case", got)
	}
}

// The brake calls Observe with its own lock held, and the poll reads the
// brake's figures under that lock: the Warner never holds its own lock
// while it reads them, so the two never wait on each other in a circle.
func TestWarnerObserveUnderTheBrakesLock(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	var brake sync.Mutex
	figures := &budgetFigures{f: detect.BudgetFigures{Calls: 5, DailyRequests: 20}}
	a, err := detect.NewAlerter(db, detect.AlerterOptions{Location: time.UTC, Hooks: []detect.Notifier{&hook{}}, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAlerter(t, a)
	w, err := detect.NewWarner(a, func(now time.Time) detect.BudgetFigures {
		brake.Lock()
		defer brake.Unlock()
		return figures.get(now)
	}, detect.WarnerOptions{Location: time.UTC, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 2000 {
				brake.Lock()
				w.Observe(detect.BudgetFigures{Day: "2026-03-04", Month: "2026-03", Calls: 5, DailyRequests: 20})
				brake.Unlock()
			}
		})
		wg.Go(func() {
			for range 2000 {
				w.Check(c.now())
			}
		})
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Observe under the brake's lock and Check wait on each other")
	}
}
