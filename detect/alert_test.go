package detect_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/detect/smtptest"
	"breakwater/storage"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newAlerter(t *testing.T, db *storage.DB, c *clock, mail detect.Sender) *detect.Alerter {
	t.Helper()
	a, err := detect.NewAlerter(db, detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Mail: mail, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func closeAlerter(t *testing.T, a *detect.Alerter) {
	t.Helper()
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestAlertOncePerIntervalAcrossRestartsRearmedAtMidnight(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 22, 0, 0, 0, time.UTC)}
	mail := &fakeSender{}
	a := newAlerter(t, db, c, mail)
	a.Alert(detect.KindBrakeEngaged, "brake engaged", nil)
	c.add(59 * time.Minute)
	a.Alert(detect.KindBrakeEngaged, "brake engaged", nil) // inside the interval
	a.Alert(detect.KindUsageCommitFailed, "usage", nil)    // another kind
	closeAlerter(t, a)
	if got := mail.count(); got != 2 {
		t.Fatalf("%d mails, want 2 (one per kind)", got)
	}

	// A restart inside the interval: still held back.
	a = newAlerter(t, db, c, mail)
	a.Alert(detect.KindBrakeEngaged, "brake engaged", nil)
	// The interval has passed: sent again.
	c.add(time.Minute)
	a.Alert(detect.KindBrakeEngaged, "brake engaged", nil)
	// Midnight re-arms it, though the interval has not passed.
	c.add(30 * time.Minute) // 23:30
	a.Alert(detect.KindBrakeEngaged, "brake engaged", nil)
	c.add(31 * time.Minute) // 00:01 the next day
	a.Alert(detect.KindBrakeEngaged, "brake engaged", nil)
	closeAlerter(t, a)
	if got := mail.count(); got != 4 {
		t.Fatalf("%d mails, want 4: %v", got, mail.subjects)
	}
	if got := mail.subjects[0]; got != "alert: brake engaged" {
		t.Errorf("subject %q", got)
	}
}

// AlertWith makes the text only for an alert it raises: a flood of brake
// refusals inside MinInterval builds it once, and the one mail carries it.
func TestAlertWithBuildsOnlyWhatItRaises(t *testing.T) {
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	mail := &fakeSender{}
	a := newAlerter(t, db, c, mail)
	built := 0
	build := func() (string, map[string]string) {
		built++
		return "brake engaged", map[string]string{"ceiling": "daily_requests"}
	}
	for range 1000 {
		a.AlertWith(detect.KindBrakeEngaged, build)
	}
	c.add(time.Hour) // the interval has passed: raised, and built, again
	a.AlertWith(detect.KindBrakeEngaged, build)
	closeAlerter(t, a)
	if built != 2 {
		t.Errorf("the text was made %d times, want 2 (once per alert raised)", built)
	}
	if got := mail.count(); got != 2 || mail.subjects[0] != "alert: brake engaged" {
		t.Errorf("%d mails %v, want 2 with the built summary", got, mail.subjects)
	}
}

func TestAlertLoggedWithoutMail(t *testing.T) {
	db := mustOpen(t)
	var logs strings.Builder
	var mu sync.Mutex
	c := &clock{t: time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)}
	a, err := detect.NewAlerter(db, detect.AlerterOptions{Location: time.UTC, Now: c.now, Logger: detect.NewTestLogger(&logs, &mu)})
	if err != nil {
		t.Fatal(err)
	}
	a.Alert(detect.KindFailOpen, "layer rate failing open", map[string]string{"layer": "rate"})
	closeAlerter(t, a)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "ALERT layer_failing_open") {
		t.Errorf("no WARN alert in the log: %s", logs.String())
	}
}

// mailerFor returns a Mailer to addr with fast retries.
func mailerFor(t *testing.T, addr string, counters *detect.Counters) *detect.Mailer {
	t.Helper()
	host, port := detect.SplitAddr(t, addr)
	m, err := detect.NewMailer(detect.AlertsConfig{SMTPHost: host, SMTPPort: port, From: "breakwater@example.com", To: []string{"ops@example.com"}, TLS: "none"},
		detect.MailerOptions{RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, Attempts: 50, Timeout: 300 * time.Millisecond, Counters: counters})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return m
}

func TestMailUserTextCannotAddHeaders(t *testing.T) {
	srv := smtptest.Start(t, "127.0.0.1:0")
	counters := &detect.Counters{}
	m := mailerFor(t, srv.Addr, counters)
	db := mustOpen(t)
	c := &clock{t: time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)}
	a := newAlerter(t, db, c, m)
	evil := "mallory\r\nBcc: victim@evil.test\r\nSubject: hi"
	a.Alert(detect.KindUsageCommitFailed, "usage record not written for "+evil, map[string]string{"user": evil})
	msgs := srv.WaitFor(t, 1, 10*time.Second)
	msg := msgs[0]
	if len(msg.To) != 1 || msg.To[0] != "ops@example.com" {
		t.Errorf("recipients %v, want only ops@example.com", msg.To)
	}
	h := strings.ToLower(msg.Headers())
	if strings.Contains(h, "bcc") || strings.Contains(h, "evil") {
		t.Errorf("user text reached the headers:\n%s", msg.Headers())
	}
	if strings.Count(h, "subject:") != 1 || !strings.Contains(h, "subject: [breakwater] alert: usage commit failed") {
		t.Errorf("subject not the fixed one:\n%s", msg.Headers())
	}
	if !strings.Contains(msg.Data, `mallory\u000d\u000aBcc: victim@evil.test`) {
		t.Errorf("body does not carry the escaped user id:\n%s", msg.Data)
	}
	detect.WaitSent(t, counters, 1)
}

func TestMailRetriedWhenServerIsDown(t *testing.T) {
	hole := smtptest.StartBlackhole(t, "127.0.0.1:0") // accepts and never answers
	counters := &detect.Counters{}
	m := mailerFor(t, hole.Addr, counters)
	start := time.Now()
	if !m.Send("alert: test", "body") {
		t.Fatal("dropped")
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("Send waited %s", d)
	}
	deadline := time.Now().Add(10 * time.Second)
	for counters.AlertFailures.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no failed attempts counted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	hole.Close()
	srv := smtptest.Start(t, hole.Addr) // the server comes back on the same address
	msgs := srv.WaitFor(t, 1, 10*time.Second)
	if !strings.Contains(msgs[0].Data, "body") {
		t.Errorf("retried message %q", msgs[0].Data)
	}
	detect.WaitSent(t, counters, 1)
}
