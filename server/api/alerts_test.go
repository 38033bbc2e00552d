package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/detect/smtptest"
	"breakwater/server/edgetest"
	"breakwater/storage"
)

// alerting is an Alerter and Mailer over a real SMTP address, with fast
// retries.
type alerting struct {
	alerter  *detect.Alerter
	mailer   *detect.Mailer
	counters *detect.Counters
}

func newAlerting(t *testing.T, db *storage.DB, smtpAddr string, mailTimeout time.Duration) *alerting {
	t.Helper()
	host, p, _ := net.SplitHostPort(smtpAddr)
	port, _ := strconv.Atoi(p)
	a := &alerting{counters: &detect.Counters{}}
	var err error
	a.mailer, err = detect.NewMailer(detect.AlertsConfig{SMTPHost: host, SMTPPort: port, From: "breakwater@example.com", To: []string{"ops@example.com"}, TLS: "none"},
		detect.MailerOptions{RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, Attempts: 100, Timeout: mailTimeout, Counters: a.counters})
	if err != nil {
		t.Fatal(err)
	}
	a.alerter, err = detect.NewAlerter(db, detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Mail: a.mailer, Counters: a.counters})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.close(t) })
	return a
}

// close drains the alerts and the mail queue.
func (a *alerting) close(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.alerter.Close(ctx); err != nil {
		t.Error(err)
	}
	if err := a.mailer.Close(ctx); err != nil {
		t.Error(err)
	}
}

// newBrakeEnv is a service whose brake engages after one call, with its
// alerts mailed to smtpAddr. The alerter needs the database, so the env
// is built over a database opened first.
func newBrakeEnv(t *testing.T, smtpAddr string, mailTimeout time.Duration) (*env, *alerting) {
	t.Helper()
	dir := t.TempDir()
	db, err := storage.Open(dir+"/alerts.db", storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := newAlerting(t, db, smtpAddr, mailTimeout)
	e := newEnv(t, envOptions{dir: dir, budget: budget.Config{DailyRequests: 1}, alerts: a.alerter, counters: a.counters})
	return e, a
}

func TestBrakeEngagedMailsOnceWithinMinInterval(t *testing.T) {
	smtp := smtptest.Start(t, "127.0.0.1:0")
	e, a := newBrakeEnv(t, smtp.Addr, 5*time.Second)
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")

	msgs := smtp.WaitFor(t, 1, 5*time.Second)
	if !strings.Contains(msgs[0].Headers(), "Subject: [breakwater] alert: brake engaged") {
		t.Errorf("alert e-mail:\n%s", msgs[0].Data)
	}
	// The operator's mail names the ceiling, its value, the count, when it
	// reopens and how to release it; the client's 503 named none of it.
	for _, want := range []string{"ceiling: daily_requests = 1 call\r\n", "count: 1 call today, calls in flight included\r\n", "reopens at: ", "config.toml [budget]"} {
		if !strings.Contains(msgs[0].Data, want) {
			t.Errorf("alert e-mail lacks %q:\n%s", want, msgs[0].Data)
		}
	}

	// A second engagement within min_interval sends nothing.
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
	a.close(t) // drains both queues: anything queued is delivered now
	if got := len(smtp.Messages()); got != 1 {
		t.Errorf("%d e-mails, want exactly 1", got)
	}
	if got := metric(t, e, "breakwater_alerts_sent_total"); got != "1" {
		t.Errorf("breakwater_alerts_sent_total = %s, want 1", got)
	}
}

func TestSMTPDownNeitherSlowsRequestsNorLosesTheAlert(t *testing.T) {
	hole := smtptest.StartBlackhole(t, "127.0.0.1:0") // a mail server that hangs
	e, _ := newBrakeEnv(t, hole.Addr, 2*time.Second)
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)

	// The second call passes the day's ceiling of one: the brake engages.
	start := time.Now()
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
	took := time.Since(start)
	if took > time.Second {
		t.Errorf("the refusal that raised the alert took %s with SMTP hanging", took)
	}
	for range 5 {
		start = time.Now()
		resp, _ = e.post(e.key, "image/png", img)
		resp.Body.Close()
		if d := time.Since(start); d > time.Second {
			t.Errorf("a refusal took %s with SMTP hanging", d)
		}
	}
	// The mail is retried; once the server answers, it arrives.
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, e, "breakwater_alert_failures_total") == "0" {
		if time.Now().After(deadline) {
			t.Fatal("no failed delivery counted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	hole.Close()
	smtp := smtptest.Start(t, hole.Addr)
	msgs := smtp.WaitFor(t, 1, 15*time.Second)
	if !strings.Contains(msgs[0].Headers(), "alert: brake engaged") {
		t.Errorf("retried e-mail:\n%s", msgs[0].Data)
	}
}

// recordingAlerter keeps the kinds raised.
type recordingAlerter struct {
	mu    sync.Mutex
	kinds []string
}

func (r *recordingAlerter) Alert(kind, _ string, _ map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, kind)
}

func (r *recordingAlerter) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.kinds...)
}

func TestRepeatedFailOpenAndUsageFailureAlert(t *testing.T) {
	rec := &recordingAlerter{}
	usage := &flakyUsage{}
	e := newEnv(t, envOptions{rate: panickingLimiter{}, alerts: rec, usage: usage})
	usage.db = e.db
	img := pngBytes(t, 16, 16)
	for i := range failOpenAlertAfter {
		// The last record fails (a failure pauses paid calls, so it must
		// come last for every request to reach the broken limiter).
		usage.failing.Store(i == failOpenAlertAfter-1)
		resp, _ := e.post(e.key, "image/png", img)
		resp.Body.Close()
		if i == failOpenAlertAfter-2 {
			if got := rec.got(); strings.Contains(strings.Join(got, ","), detect.KindFailOpen) {
				t.Fatalf("fail-open alert after %d faults: %v", i+1, got)
			}
		}
	}
	got := strings.Join(rec.got(), ",")
	if strings.Count(got, detect.KindFailOpen) != 1 || !strings.Contains(got, detect.KindUsageCommitFailed) {
		t.Errorf("alerts %s, want one %s and %s", got, detect.KindFailOpen, detect.KindUsageCommitFailed)
	}
}

// metric reads one series' value from the admin /metrics.
func metric(t *testing.T, e *env, name string) string {
	t.Helper()
	req := mustRequest(t, http.MethodGet, e.admin.URL+"/metrics", testAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("metric %s missing", name)
	return ""
}

// TestDashboardShowsAlerts: an alert raised by a request appears in the
// dashboard's findings and alerts.
func TestDashboardShowsAlerts(t *testing.T) {
	smtp := smtptest.Start(t, "127.0.0.1:0")
	e, _ := newBrakeEnv(t, smtp.Addr, 5*time.Second)
	img := pngBytes(t, 16, 16)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
	smtp.WaitFor(t, 1, 5*time.Second) // the alert has been handled
	var shown string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		d, err := e.adm.Dashboard(context.Background(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		shown = strings.Join(d.Findings, "\n")
		if strings.Contains(shown, "brake_engaged") {
			return
		}
	}
	t.Errorf("dashboard findings and alerts:\n%s\nwant the brake_engaged alert", shown)
}

// A refused GEMINI_API_KEY fails every read until the operator fixes it:
// it is mailed at once, not in the next day's digest.
func TestRefusedUpstreamKeyAlertsAtOnce(t *testing.T) {
	rec := &recordingAlerter{}
	e := newEnv(t, envOptions{alerts: rec})
	e.gemini.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT",`+
			`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID"}]}}`)
	})
	resp, data := e.post(e.key, "image/png", pngBytes(t, 8, 8))
	edgetest.DecodeProblem(t, resp, data, http.StatusBadGateway, "upstream_failed")
	if got := rec.got(); len(got) != 1 || got[0] != detect.KindUpstreamKeyRefused {
		t.Errorf("alerts %v, want %s", got, detect.KindUpstreamKeyRefused)
	}
	// Another upstream failure is no key alert.
	e.gemini.set(func(w http.ResponseWriter, r *http.Request) {
		writeUpstreamError(w, http.StatusInternalServerError, "INTERNAL")
	})
	e.post(e.key, "image/png", pngBytes(t, 8, 8))
	if got := rec.got(); len(got) != 1 {
		t.Errorf("alerts after a 500: %v, want still only the key alert", got)
	}
}

// TestDeadWebhookDoesNotSlowRequests: a webhook receiver that takes the
// connection and never answers holds only the webhook's goroutine. The
// refusals that raise the brake alert are measured against the same
// service without a webhook: each stays under a loose bound, and their
// median within a margin of the other's.
func TestDeadWebhookDoesNotSlowRequests(t *testing.T) {
	release := make(chan struct{})
	dead := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	t.Cleanup(dead.Close)
	measure := func(hooks []detect.Notifier) time.Duration {
		dir := t.TempDir()
		db, err := storage.Open(dir+"/alerts.db", storage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		// A min_interval of zero lets every refusal raise the alert.
		alerter, err := detect.NewAlerter(db, detect.AlerterOptions{MinInterval: time.Nanosecond, Location: time.UTC, Hooks: hooks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			alerter.Close(ctx)
		})
		e := newEnv(t, envOptions{dir: dir, budget: budget.Config{DailyRequests: 1}, alerts: alerter})
		img := pngBytes(t, 16, 16)
		resp, data := e.post(e.key, "image/png", img)
		decodeOK(t, resp, data)
		var took []time.Duration
		for range 15 {
			start := time.Now()
			resp, data := e.post(e.key, "image/png", img)
			took = append(took, time.Since(start))
			edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "budget_paused")
			if d := took[len(took)-1]; d > time.Second {
				t.Errorf("a refusal took %s", d)
			}
		}
		slices.Sort(took)
		return took[len(took)/2]
	}
	counters := &detect.Counters{}
	hook, err := detect.NewWebhook(detect.WebhookConfig{Format: detect.FormatJSON, URLEnv: "HOOK"}, dead.URL, "",
		detect.WebhookOptions{QueueSize: 2, Timeout: time.Minute, Counters: counters})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hook.Close(ctx)
	})
	t.Cleanup(func() { close(release) }) // runs before the webhook closes: the receiver lets go
	withDead := measure([]detect.Notifier{hook})
	without := measure(nil)
	if withDead > without+250*time.Millisecond {
		t.Errorf("median refusal %s with a dead webhook, %s without", withDead, without)
	}
	// The alerts that did not fit the webhook's queue were dropped and
	// counted, not waited for.
	deadline := time.Now().Add(5 * time.Second)
	for counters.WebhookDropped.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if counters.WebhookDropped.Load() == 0 {
		t.Error("no webhook alert dropped: the dead receiver's queue never filled")
	}
}
