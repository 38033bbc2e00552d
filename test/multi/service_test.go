package multi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/detect/smtptest"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// newServicePair is newPair with extra sections appended to the config
// (mail, the detection's schedule) before both instances start at once.
func newServicePair(t *testing.T, dbURL, extra string) *pair {
	t.Helper()
	return newPairEdited(t, dbURL, harness.Config{DailyRequests: 100000}, 1, 0, func(body string) string { return body + "\n" + extra })
}

// mailConfig is the [alerts] section that mails every alert and digest to
// the test's SMTP server, and a [detect] schedule under which yesterday's
// run is due at any time of day, so each instance runs it at start.
func mailConfig(t *testing.T, smtp *smtptest.Server) string {
	t.Helper()
	host, port, err := net.SplitHostPort(smtp.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`[detect]
run_at = "00:00"

[alerts]
smtp_host = %q
smtp_port = %s
tls = "none"
from = "breakwater@example.com"
to = ["ops@example.com"]
min_interval = "1h"
`, host, port)
}

// waitLogs waits, up to timeout, until the log of each instance holds one
// of lines, and fails t if one never does.
func (p *pair) waitLogs(t *testing.T, timeout time.Duration, lines ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for i := range 2 {
		for {
			b, _ := os.ReadFile(p.proc(i).LogPath)
			if containsAny(string(b), lines) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("instance %d never logged one of %q\n%s", i, lines, p.logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// mailsAbout counts the messages whose subject holds subject.
func mailsAbout(msgs []smtptest.Message, subject string) int {
	n := 0
	for _, m := range msgs {
		if strings.Contains(m.Headers(), subject) {
			n++
		}
	}
	return n
}

// seedFailures writes yesterday's statistics events of a user whose reads
// all failed: 30 attempts, the failures detector's finding.
func seedFailures(t *testing.T, dbURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, dbURL, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	y := time.Now().UTC().AddDate(0, 0, -1)
	noon := time.Date(y.Year(), y.Month(), y.Day(), 12, 0, 0, 0, time.UTC)
	events := make([]detect.Event, 30)
	for i := range events {
		events[i] = detect.Event{Time: noon.Add(time.Duration(i) * time.Second), UserID: "user0", Plan: plan,
			IP: "192.0.2.7", Route: "/v1/ocr", Outcome: "upstream_error", Status: http.StatusBadGateway}
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
}

// TestDetectionOnceForTheService: two instances start together on a
// database whose yesterday holds a finding, and each is due to run
// yesterday's detection at start. One runs it and mails the digest; the
// other skips it (the first holds the lead) or finds it done: one digest
// for the service, one run record, and both instances' dashboards see
// the findings.
func TestDetectionOnceForTheService(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	smtp := smtptest.Start(t, "127.0.0.1:0")
	seedFailures(t, dbURL)
	p := newServicePair(t, dbURL, mailConfig(t, smtp))
	p.waitLogs(t, 30*time.Second, "daily detection done", "daily detection skipped here", "daily detection: nothing due here")
	smtp.WaitFor(t, 1, 20*time.Second)
	p.stopAll() // a clean stop delivers what mail is queued
	msgs := smtp.Messages()
	if got := mailsAbout(msgs, "detection digest"); got != 1 {
		t.Fatalf("%d detection digests from two instances, want 1\n%s", got, p.logs())
	}
	ran := 0
	for i := range 2 {
		b, _ := os.ReadFile(p.proc(i).LogPath)
		ran += strings.Count(string(b), "daily detection done")
	}
	if ran != 1 {
		t.Errorf("%d runs of yesterday's detection over two instances, want 1\n%s", ran, p.logs())
	}
	if !strings.Contains(msgs[0].Data, "failures") {
		t.Errorf("the digest does not carry the failures finding:\n%s", msgs[0].Data)
	}
}

// TestBrakeAlertOnceForTheService: the brake switched on through the CLI
// refuses on both instances, each refusal raising the brake alert: one
// alert mail for the service, not one per instance.
func TestBrakeAlertOnceForTheService(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	smtp := smtptest.Start(t, "127.0.0.1:0")
	p := newServicePair(t, pgtest.NewDatabase(t), mailConfig(t, smtp))
	if out, err := harness.Command(ctx, bin, p.config, p.env, "brake", "on"); err != nil {
		t.Fatalf("brake on: %v\n%s", err, out)
	}
	changed := time.Now()
	p.until(ctx, t, changed, 0, 0, http.StatusServiceUnavailable, "paused_by_operator")
	p.until(ctx, t, changed, 1, 0, http.StatusServiceUnavailable, "paused_by_operator")
	// A flood of refused reads on both at once: each instance raises the
	// alert, and claims it.
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for k := range 40 {
		wg.Go(func() { p.send(ctx, client, k%2, 0, nil) })
	}
	wg.Wait()
	p.waitLogs(t, 20*time.Second, "ALERT brake_engaged", "alert already sent by another instance")
	smtp.WaitFor(t, 1, 20*time.Second)
	p.stopAll()
	if got := mailsAbout(smtp.Messages(), "alert: brake engaged"); got != 1 {
		t.Fatalf("%d brake alerts from two instances, want 1\n%s", got, p.logs())
	}
}

// scrapeMetrics reads instance i's /metrics.
func (p *pair) scrapeMetrics(ctx context.Context, t *testing.T, i int) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.proc(i).AdminAddr()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics of instance %d: %d", i, resp.StatusCode)
	}
	return b.String()
}

// TestServiceRefusalsOnEveryInstance: refusals answered by both
// instances are the service's on either: /metrics shows them in
// breakwater_service_refusals_today beside the instance's own
// breakwater_refusals_total, which counts only what that instance refused
// since it started.
func TestServiceRefusalsOnEveryInstance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newServicePair(t, pgtest.NewDatabase(t), "")
	if out, err := harness.Command(ctx, bin, p.config, p.env, "brake", "on"); err != nil {
		t.Fatalf("brake on: %v\n%s", err, out)
	}
	changed := time.Now()
	p.until(ctx, t, changed, 0, 0, http.StatusServiceUnavailable, "paused_by_operator")
	p.until(ctx, t, changed, 1, 0, http.StatusServiceUnavailable, "paused_by_operator")
	refused := 2 // one each: until stops at the first refusal
	client := &http.Client{Timeout: 10 * time.Second}
	for k := range 9 {
		if r := p.send(ctx, client, k%2, 0, nil); r.answer.Code != "paused_by_operator" {
			t.Fatalf("request %d: %d %s, want 503 paused_by_operator", k, r.answer.Status, r.answer.Code)
		}
		refused++
	}
	// A clean stop writes each instance's per-minute rows of refusals;
	// instance 0 then starts afresh, its own counters at zero.
	p.stopAll()
	p.start(0)
	m := p.scrapeMetrics(ctx, t, 0)
	if want := fmt.Sprintf(`breakwater_service_refusals_today{layer="budget"} %d`, refused); !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "refusals"))
	}
	if want := `breakwater_refusals_total{layer="budget",reason="manual"} 0`; !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s: the instance's own count:\n%s", want, grepLines(m, "refusals"))
	}
}

// grepLines returns the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
