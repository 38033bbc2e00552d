package detect

import (
	"strings"
	"testing"
	"time"
)

// TestAggregateOlderEventsAsBefore: events stored one per invite check by
// older versions still aggregate as they did.
func TestAggregateOlderEventsAsBefore(t *testing.T) {
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	s := Aggregate("2026-03-08", []Event{
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
