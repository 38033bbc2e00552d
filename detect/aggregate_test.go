package detect

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"breakwater/storage"
)

// TestRunBoundsIPsAndEmails floods a day with more distinct IPs and
// e-mails than max_keys, the heavy hitters arriving last, when the tables
// are long full: at most max_keys of each are kept with the rest summed
// under Other, nothing is lost from the sums, and the detectors still
// flag the heavy hitters.
func TestRunBoundsIPsAndEmails(t *testing.T) {
	const maxKeys = 10
	db := mustOpen(t)
	at := time.Date(2026, 3, 8, 1, 0, 0, 0, time.UTC)
	var events []storage.Event
	add := func(e storage.Event) {
		e.Time = at.Add(time.Duration(len(events)) * time.Second)
		events = append(events, e)
	}
	for i := range 300 { // one refusal each: 300 IPs, 300 e-mails
		add(storage.Event{Route: RouteInvite, Outcome: "invalid", IP: fmt.Sprintf("198.51.100.%d", i%250), UserID: fmt.Sprintf("guess%d@example.com", i)})
		add(storage.Event{Route: "/v1/ocr", Outcome: "ok", UserID: "alice", IP: fmt.Sprintf("2001:db8:%x::1", i)}) // alice roams: 300 /64s
	}
	for range 4 { // the brute force, in rows as the Recorder writes them
		add(storage.Event{Route: RouteInvite, Outcome: OutcomeRefused, IP: "203.0.113.7", Count: 5})
		add(storage.Event{Route: RouteInvite, Outcome: OutcomeRefused, UserID: "target@example.com", Count: 5})
		add(storage.Event{Route: RouteInvite, Outcome: "invalid", Count: 5})
		add(storage.Event{Route: RouteInvite, Outcome: OutcomeCooldownStarted, IP: "203.0.113.7"})
		add(storage.Event{Route: RouteInvite, Outcome: OutcomeCooldownStarted, UserID: "target@example.com"})
	}
	for i := range 6 { // an account farm on one address
		add(storage.Event{Route: "/v1/ocr", Outcome: "ok", UserID: fmt.Sprintf("farm%d", i), IP: "192.0.2.50"})
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	r, err := NewRunner(db, RunnerOptions{Config: Config{MaxKeys: maxKeys}, Location: time.UTC, Now: func() time.Time { return at.AddDate(0, 0, 1) }})
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
		t.Errorf("%d IPs and %d e-mails stored, want at most %d each with %q", len(s.IPs), len(s.Emails), maxKeys+1, Other)
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
	if s.IPs[Other].InviteFailures == 0 || s.Emails[Other].InviteFailures == 0 {
		t.Errorf("nothing under %q: IPs %+v, e-mails %+v", Other, s.IPs[Other], s.Emails[Other])
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
	if got, want := subjects(rep.Findings, DetectorInvite), []string{"203.0.113.7", "target@example.com"}; !slices.Equal(got, want) {
		t.Errorf("invite findings %v, want %v", got, want)
	}
	if got, want := subjects(rep.Findings, DetectorSharedIP), []string{"192.0.2.50"}; !slices.Equal(got, want) {
		t.Errorf("shared-IP findings %v, want %v (never %q: its users come from many IPs)", got, want, Other)
	}
}

// TestAggregateOlderEventsAsBefore: events stored one per invite check by
// older versions still aggregate as they did.
func TestAggregateOlderEventsAsBefore(t *testing.T) {
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	s := Aggregate("2026-03-08", []storage.Event{
		{Time: at, IP: "198.51.100.9", UserID: "x@example.com", Route: RouteInvite, Outcome: "invalid"},
		{Time: at, IP: "198.51.100.9", UserID: "x@example.com", Route: RouteInvite, Outcome: "cooldown"},
		{Time: at, IP: "198.51.100.9", Route: RouteInvite, Outcome: OutcomeCooldownStarted},
		{Time: at, UserID: "x@example.com", Route: RouteInvite, Outcome: OutcomeCooldownStarted},
		{Time: at, IP: "198.51.100.9", UserID: "x@example.com", Route: RouteInvite, Outcome: "ok"},
	}, Lines{})
	if got := s.IPs["198.51.100.9"]; got.InviteFailures != 2 || got.InviteCooldowns != 1 {
		t.Errorf("IP = %+v, want 2 failures and 1 cooldown", got)
	}
	if got := s.Emails["x@example.com"]; got.InviteFailures != 2 || got.InviteCooldowns != 1 {
		t.Errorf("e-mail = %+v, want 2 failures and 1 cooldown", got)
	}
	if s.Service.Invites != 3 {
		t.Errorf("service invites %d, want 3", s.Service.Invites)
	}
	if _, ok := s.IPs[Other]; ok {
		t.Errorf("%q present without overflow", Other)
	}
}

func TestConfigMaxKeys(t *testing.T) {
	if got := (Config{}).WithDefaults().MaxKeys; got != DefaultMaxKeys {
		t.Errorf("default max_keys %d, want %d", got, DefaultMaxKeys)
	}
	if err := (Config{MaxKeys: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "detect.max_keys") {
		t.Errorf("max_keys -1: %v, want an error naming detect.max_keys", err)
	}
}
