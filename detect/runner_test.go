package detect_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage"
)

func mustOpen(t *testing.T) *storage.DB {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "d.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// fakeSender keeps what it is asked to send.
type fakeSender struct {
	mu       sync.Mutex
	subjects []string
	bodies   []string
}

func (f *fakeSender) Send(subject, body string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subjects, f.bodies = append(f.subjects, subject), append(f.bodies, body)
	return true
}

func (f *fakeSender) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subjects)
}

// TestRunnerAggregatesADSTDay stores events around a 23-hour day in New
// York and checks that the day holds exactly its own events, that a
// re-run replaces it, and that old events are pruned.
func TestRunnerAggregatesADSTDay(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	db := mustOpen(t)
	at := func(d, h, m int) time.Time { return time.Date(2026, 3, d, h, m, 0, 0, ny) }
	ocr := func(t time.Time, user, ip, outcome string, cost int64) detect.Event {
		return detect.Event{Time: t, UserID: user, IP: ip, Route: "/v1/ocr", Outcome: outcome, CostMicroUSD: cost}
	}
	events := []detect.Event{
		ocr(at(7, 23, 59), "alice", "192.0.2.1", "ok", 5), // the day before
		ocr(at(8, 0, 0), "alice", "192.0.2.1", "ok", 10),  // first instant
		ocr(at(8, 3, 30), "alice", "192.0.2.2", "ok", 10), // after the jump
		ocr(at(8, 23, 59), "bob", "192.0.2.1", "upstream_failed", 30),
		ocr(at(9, 0, 0), "bob", "192.0.2.1", "ok", 10), // the day after
		{Time: at(8, 12, 0), IP: "198.51.100.9", Route: detect.RouteInvite, Outcome: "cooldown", UserID: "x@example.com"},
		{Time: at(8, 12, 0), IP: "198.51.100.9", Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted},
		{Time: at(8, 12, 0), Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted, UserID: "x@example.com"},
		{Time: at(8, 12, 1), IP: "198.51.100.9", Route: detect.RouteInvite, Outcome: "bad_code"},
		{Time: at(8, 12, 2), IP: "198.51.100.9", Route: detect.RouteInvite, Outcome: "ok"},
		ocr(at(1, 12, 0), "old", "192.0.2.9", "ok", 1), // past retention
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	mail := &fakeSender{}
	r, err := detect.NewRunner(db, detect.RunnerOptions{
		Config: detect.Config{InviteCooldowns: 1}, Location: ny, RetentionDays: 5, Mail: mail,
		Lines: func() detect.Lines { return detect.Lines{ByUser: map[string]int64{"alice": 50, "bob": 50}} }, Now: func() time.Time { return at(9, 0, 15) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if last, err := r.LastRun(); err != nil || last != "" {
		t.Fatalf("LastRun before any run = %q, %v; want \"\", nil", last, err)
	}
	if got := r.Yesterday(at(9, 0, 15)); got != "2026-03-08" {
		t.Fatalf("Yesterday = %s", got)
	}
	rep, err := r.Run(context.Background(), "2026-03-08", true)
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Service
	if s.Attempts != 3 || s.Successes != 2 || s.Failures != 1 || s.CostMicroUSD != 50 || s.Users != 2 || s.IPs != 2 || s.Invites != 3 {
		t.Errorf("service = %+v, want 3 attempts (2 ok, 1 failed), 50 µ$, 2 users, 2 IPs, 3 invites", s)
	}
	stats, err := db.DayStats("2026-03-08", "2026-03-08")
	if err != nil || len(stats) != 1 {
		t.Fatalf("stored aggregates %v, %v", stats, err)
	}
	if a := stats[0].Users["alice"]; a.Attempts != 2 || a.IPs != 2 || a.Line != 50 {
		t.Errorf("alice = %+v, want 2 attempts from 2 IPs, line 50", a)
	}
	if ip := stats[0].IPs["192.0.2.1"]; ip.Users != 2 || ip.Attempts != 2 {
		t.Errorf("192.0.2.1 = %+v, want 2 users, 2 attempts", ip)
	}
	if ip := stats[0].IPs["198.51.100.9"]; ip.InviteFailures != 2 || ip.InviteCooldowns != 1 {
		t.Errorf("invite IP = %+v, want 2 failures, 1 cooldown", ip)
	}
	if got := detect.Subjects(rep.Findings, detect.DetectorInvite); len(got) != 2 {
		t.Errorf("invite findings %v, want the IP and the e-mail", got)
	}
	if rep.Pruned != 1 {
		t.Errorf("pruned %d events, want 1", rep.Pruned)
	}
	if !rep.Mailed || mail.count() != 1 {
		t.Errorf("digest mailed %v, %d sent; want one", rep.Mailed, mail.count())
	}

	// Re-running the day replaces it: same figures, findings not doubled.
	rep2, err := r.Run(context.Background(), "2026-03-08", false)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := db.Findings("2026-03-08", "2026-03-08")
	if rep2.Service != rep.Service || len(stored) != len(rep.Findings) || mail.count() != 1 {
		t.Errorf("re-run: %+v, %d stored findings, %d mails; want the same figures, %d, 1", rep2.Service, len(stored), mail.count(), len(rep.Findings))
	}
	if last, _ := r.LastRun(); last != "2026-03-08" {
		t.Errorf("LastRun = %q", last)
	}
	if _, err := r.Run(context.Background(), "March 8", false); err == nil {
		t.Error("a bad day ran")
	}
	// A day past retention is refused, its aggregate kept.
	if _, err := r.Run(context.Background(), "2026-03-01", false); !errors.Is(err, detect.ErrPruned) {
		t.Errorf("run of a pruned day: %v, want detect.ErrPruned", err)
	}
}

// TestRunnerSetConfig: thresholds changed by a config reload apply to the
// next run; an invalid change is refused and the old thresholds kept.
func TestRunnerSetConfig(t *testing.T) {
	db := mustOpen(t)
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	var events []detect.Event
	for i := range 6 { // six users on one IP
		events = append(events, detect.Event{Time: at, UserID: fmt.Sprintf("u%d", i), IP: "192.0.2.7", Route: "/v1/ocr", Outcome: "ok"})
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	r, err := detect.NewRunner(db, detect.RunnerOptions{Config: detect.Config{IPUsers: 10}, Location: time.UTC, Now: func() time.Time { return at.AddDate(0, 0, 1) }})
	if err != nil {
		t.Fatal(err)
	}
	shared := func() int {
		t.Helper()
		rep, err := r.Run(context.Background(), "2026-03-08", false)
		if err != nil {
			t.Fatal(err)
		}
		return len(detect.Subjects(rep.Findings, detect.DetectorSharedIP))
	}
	if n := shared(); n != 0 {
		t.Fatalf("ip_users 10: %d shared-IP findings, want 0", n)
	}
	if err := r.SetConfig(detect.Config{IPUsers: 5}); err != nil {
		t.Fatal(err)
	}
	if n := shared(); n != 1 {
		t.Fatalf("ip_users 5 after SetConfig: %d shared-IP findings, want 1", n)
	}
	if err := r.SetConfig(detect.Config{GreyDays: 9}); err == nil {
		t.Fatal("grey_days 9 was accepted")
	}
	if n := shared(); n != 1 {
		t.Fatalf("after a refused SetConfig: %d shared-IP findings, want 1 (ip_users 5 kept)", n)
	}
}

// TestDigestCoversSeveralDays: a catch-up's findings go out in one mail
// that names the first and last day with findings; days without findings
// add nothing, and nothing at all is sent when no day has one.
func TestDigestCoversSeveralDays(t *testing.T) {
	mail := &fakeSender{}
	r, err := detect.NewRunner(mustOpen(t), detect.RunnerOptions{Location: time.UTC, Mail: mail})
	if err != nil {
		t.Fatal(err)
	}
	finding := func(day, subject string) detect.Finding {
		return detect.Finding{Day: day, Detector: detect.DetectorSharedIP, Subject: subject, Figures: map[string]float64{"users": 6}}
	}
	if r.Digest([]detect.Report{{Day: "2026-03-01"}, {Day: "2026-03-02"}}) || mail.count() != 0 {
		t.Fatal("a digest without findings was sent")
	}
	reps := []detect.Report{
		{Day: "2026-03-01", Findings: []detect.Finding{finding("2026-03-01", "192.0.2.1")}},
		{Day: "2026-03-02"},
		{Day: "2026-03-03", Findings: []detect.Finding{finding("2026-03-03", "192.0.2.2"), finding("2026-03-03", "192.0.2.3")}},
	}
	if !r.Digest(reps) || mail.count() != 1 {
		t.Fatalf("%d mails sent, want 1", mail.count())
	}
	if got, want := mail.subjects[0], "detection digest for 2026-03-01 to 2026-03-03: 3 findings"; got != want {
		t.Errorf("subject %q, want %q", got, want)
	}
	body := mail.bodies[0]
	for _, want := range []string{"for 2026-03-01: 1 finding.", "for 2026-03-03: 2 findings", "192.0.2.1", "192.0.2.2", "192.0.2.3"} {
		if !strings.Contains(body, want) {
			t.Errorf("body lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "2026-03-02") {
		t.Errorf("body mentions the day without findings:\n%s", body)
	}
}

// TestRunBoundsIPsAndEmails floods a day with more distinct IPs and
// e-mails than max_keys, the heavy hitters arriving last, when the tables
// are long full: at most max_keys of each are kept with the rest summed
// under Other, nothing is lost from the sums, and the detectors still
// flag the heavy hitters.
func TestRunBoundsIPsAndEmails(t *testing.T) {
	const maxKeys = 10
	db := mustOpen(t)
	at := time.Date(2026, 3, 8, 1, 0, 0, 0, time.UTC)
	var events []detect.Event
	add := func(e detect.Event) {
		e.Time = at.Add(time.Duration(len(events)) * time.Second)
		events = append(events, e)
	}
	for i := range 300 { // one refusal each: 300 IPs, 300 e-mails
		add(detect.Event{Route: detect.RouteInvite, Outcome: "invalid", IP: fmt.Sprintf("198.51.100.%d", i%250), UserID: fmt.Sprintf("guess%d@example.com", i)})
		add(detect.Event{Route: "/v1/ocr", Outcome: "ok", UserID: "alice", IP: fmt.Sprintf("2001:db8:%x::1", i)}) // alice roams: 300 /64s
	}
	for range 4 { // the brute force, in rows as the Recorder writes them
		add(detect.Event{Route: detect.RouteInvite, Outcome: detect.OutcomeRefused, IP: "203.0.113.7", Count: 5})
		add(detect.Event{Route: detect.RouteInvite, Outcome: detect.OutcomeRefused, UserID: "target@example.com", Count: 5})
		add(detect.Event{Route: detect.RouteInvite, Outcome: "invalid", Count: 5})
		add(detect.Event{Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted, IP: "203.0.113.7"})
		add(detect.Event{Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted, UserID: "target@example.com"})
	}
	for i := range 6 { // an account farm on one address
		add(detect.Event{Route: "/v1/ocr", Outcome: "ok", UserID: fmt.Sprintf("farm%d", i), IP: "192.0.2.50"})
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	r, err := detect.NewRunner(db, detect.RunnerOptions{Config: detect.Config{MaxKeys: maxKeys}, Location: time.UTC, Now: func() time.Time { return at.AddDate(0, 0, 1) }})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(context.Background(), "2026-03-08", false)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := db.DayStats("2026-03-08", "2026-03-08")
	if err != nil || len(stored) != 1 {
		t.Fatalf("stored aggregates %v, %v", stored, err)
	}
	s := stored[0]
	if len(s.IPs) > maxKeys+1 || len(s.Emails) > maxKeys+1 {
		t.Errorf("%d IPs and %d e-mails stored, want at most %d each with %q", len(s.IPs), len(s.Emails), maxKeys+1, detect.Other)
	}
	var ipFailures, emailFailures, attempts int64
	for _, d := range s.IPs {
		ipFailures += d.InviteFailures
		attempts += d.Attempts
	}
	for _, d := range s.Emails {
		emailFailures += d.InviteFailures
	}
	if ipFailures != 320 || emailFailures != 320 || attempts != 306 {
		t.Errorf("sums over IPs: %d invite failures, %d attempts; over e-mails: %d failures; want 320, 306, 320", ipFailures, attempts, emailFailures)
	}
	if s.IPs[detect.Other].InviteFailures == 0 || s.Emails[detect.Other].InviteFailures == 0 {
		t.Errorf("nothing under %q: IPs %+v, e-mails %+v", detect.Other, s.IPs[detect.Other], s.Emails[detect.Other])
	}
	if got := s.IPs["203.0.113.7"]; got.InviteCooldowns != 4 || got.InviteFailures != 20 {
		t.Errorf("brute-forcing IP = %+v, want 4 cooldowns and 20 failures", got)
	}
	if got := s.IPs["192.0.2.50"]; got.Users != 6 {
		t.Errorf("farm IP = %+v, want 6 users", got)
	}
	if got := s.Users["alice"]; got.Attempts != 300 || got.IPs != maxKeys {
		t.Errorf("alice = %+v, want 300 attempts and her IPs counted up to %d", got, maxKeys)
	}
	if got, want := s.Service.Invites, int64(320); got != want {
		t.Errorf("service invites %d, want %d", got, want)
	}
	if got, want := detect.Subjects(rep.Findings, detect.DetectorInvite), []string{"203.0.113.7", "target@example.com"}; !slices.Equal(got, want) {
		t.Errorf("invite findings %v, want %v", got, want)
	}
	if got, want := detect.Subjects(rep.Findings, detect.DetectorSharedIP), []string{"192.0.2.50"}; !slices.Equal(got, want) {
		t.Errorf("shared-IP findings %v, want %v (never %q: its users come from many IPs)", got, want, detect.Other)
	}
}
