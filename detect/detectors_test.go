package detect

import (
	"fmt"
	"testing"
	"time"
)

// day returns an aggregate of day with the given users.
func day(d string, users map[string]UserDay) DayStats {
	return DayStats{Day: d, Users: users, IPs: map[string]IPDay{}, Emails: map[string]IPDay{}}
}

func subjects(findings []Finding, detector string) []string {
	var out []string
	for _, f := range findings {
		if f.Detector == detector {
			out = append(out, f.Subject)
		}
	}
	return out
}

// check runs Detect and compares the subjects one detector reports.
func check(t *testing.T, cfg Config, h History, detector string, want ...string) {
	t.Helper()
	got := subjects(Detect(cfg, h), detector)
	if len(got) != len(want) {
		t.Fatalf("%s found %v, want %v", detector, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s found %v, want %v", detector, got, want)
		}
	}
}

const today = "2026-03-10"

func TestDetectGreyZone(t *testing.T) {
	cfg := Config{GreyRatio: 0.8, GreyDays: 3}
	grey := UserDay{Attempts: 40, Line: 50}  // exactly 0.8
	below := UserDay{Attempts: 39, Line: 50} // just under
	tests := []struct {
		name   string
		before []DayStats
		today  UserDay
		want   []string
	}{
		{"three grey days", []DayStats{day("2026-03-08", map[string]UserDay{"u": grey}), day("2026-03-04", map[string]UserDay{"u": grey})}, grey, []string{"u"}},
		{"two grey days", []DayStats{day("2026-03-08", map[string]UserDay{"u": grey}), day("2026-03-04", map[string]UserDay{"u": below})}, grey, nil},
		{"third day just below", []DayStats{day("2026-03-08", map[string]UserDay{"u": grey}), day("2026-03-04", map[string]UserDay{"u": grey})}, below, nil},
		{"grey day outside the 7 days", []DayStats{day("2026-03-08", map[string]UserDay{"u": grey}), day("2026-03-03", map[string]UserDay{"u": grey})}, grey, nil},
		{"no line", []DayStats{day("2026-03-08", map[string]UserDay{"u": {Attempts: 999}}), day("2026-03-07", map[string]UserDay{"u": {Attempts: 999}})}, UserDay{Attempts: 999}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, cfg, History{Today: day(today, map[string]UserDay{"u": tt.today}), Before: tt.before}, DetectorGreyZone, tt.want...)
		})
	}
}

func TestDetectFailures(t *testing.T) {
	cfg := Config{FailRatio: 0.5, MinAttempts: 20}
	tests := []struct {
		name string
		u    UserDay
		want []string
	}{
		{"at ratio and minimum", UserDay{Attempts: 20, Failures: 10}, []string{"u"}},
		{"just below ratio", UserDay{Attempts: 20, Failures: 9}, nil},
		{"just below minimum", UserDay{Attempts: 19, Failures: 19}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, cfg, History{Today: day(today, map[string]UserDay{"u": tt.u})}, DetectorFailures, tt.want...)
		})
	}
}

func TestDetectSpike(t *testing.T) {
	cfg := Config{SpikeFactor: 5, SpikeFloor: 20}
	// Seven days before with a median of 30.
	var before []DayStats
	for i, n := range []int64{10, 30, 30, 40, 30, 50, 20} {
		before = append(before, day(addDays(today, i-7), map[string]UserDay{"u": {Attempts: n}}))
	}
	tests := []struct {
		name     string
		before   []DayStats
		attempts int64
		want     []string
	}{
		{"at 5x the median", before, 150, []string{"u"}},
		{"just below 5x the median", before, 149, nil},
		{"new user at 5x the floor", nil, 100, []string{"u"}},
		{"new user just below 5x the floor", nil, 99, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, cfg, History{Today: day(today, map[string]UserDay{"u": {Attempts: tt.attempts}}), Before: tt.before}, DetectorSpike, tt.want...)
		})
	}
}

func TestDetectSharedIP(t *testing.T) {
	cfg := Config{IPUsers: 5}
	for _, tt := range []struct {
		name  string
		users int64
		want  []string
	}{{"at threshold", 5, []string{"192.0.2.7"}}, {"just below", 4, nil}} {
		t.Run(tt.name, func(t *testing.T) {
			d := day(today, nil)
			d.IPs["192.0.2.7"] = IPDay{Users: tt.users, Attempts: 50}
			check(t, cfg, History{Today: d}, DetectorSharedIP, tt.want...)
		})
	}
}

func TestDetectInviteBruteForce(t *testing.T) {
	cfg := Config{InviteCooldowns: 3}
	for _, tt := range []struct {
		name      string
		cooldowns int64
		want      []string
	}{{"at threshold", 3, []string{"198.51.100.9", "x@example.com"}}, {"just below", 2, nil}} {
		t.Run(tt.name, func(t *testing.T) {
			d := day(today, nil)
			d.IPs["198.51.100.9"] = IPDay{InviteCooldowns: tt.cooldowns, InviteFailures: 20}
			d.Emails["x@example.com"] = IPDay{InviteCooldowns: tt.cooldowns, InviteFailures: 20}
			check(t, cfg, History{Today: d}, DetectorInvite, tt.want...)
		})
	}
}

func TestDetectServiceSpend(t *testing.T) {
	cfg := Config{BudgetWarnRatio: 0.8}
	ceil := Ceilings{DailyRequests: 1000, DailyMicroUSD: 10_000_000, MonthlyMicroUSD: 100_000_000}
	for _, tt := range []struct {
		name        string
		attempts    int64
		cost, month int64
		want        int // findings
	}{
		{"all below", 799, 7_999_999, 79_999_999, 0},
		{"calls at ratio", 800, 0, 0, 1},
		{"daily spend at ratio", 0, 8_000_000, 8_000_000, 1},
		{"monthly spend at ratio", 0, 0, 80_000_000, 1},
		{"all at ratio", 800, 8_000_000, 80_000_000, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := day(today, nil)
			d.Service = ServiceDay{Attempts: tt.attempts, CostMicroUSD: tt.cost}
			got := subjects(Detect(cfg, History{Today: d, MonthCostMicroUSD: tt.month, Ceilings: ceil}), DetectorService)
			if len(got) != tt.want {
				t.Errorf("%d service findings, want %d", len(got), tt.want)
			}
		})
	}
	d := day(today, nil)
	d.Service = ServiceDay{Attempts: 1e9, CostMicroUSD: 1e12}
	if got := subjects(Detect(cfg, History{Today: d, MonthCostMicroUSD: 1e12}), DetectorService); len(got) != 0 {
		t.Errorf("ceilings off: %d findings, want 0", len(got))
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"alice":                 "alice",
		"x\r\nBcc: e@evil.test": `x\u000d\u000aBcc: e@evil.test`,
		"tab\tnul\x00":          `tab\u0009nul\u0000`,
		"sep\u2028":             `sep\u2028`,
		"école":                 "école",
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAggregateGroupsIPv6ByPrefix: addresses of one IPv6 /64 are one
// client for the per-IP figures, as for the limits, so rotating inside a
// /64 does not hide a shared IP.
func TestAggregateGroupsIPv6ByPrefix(t *testing.T) {
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	var events []Event
	for i, user := range []string{"u1", "u2", "u3"} {
		events = append(events, Event{Time: at, UserID: user, IP: fmt.Sprintf("2001:db8:1:2::%x", i+1), Outcome: "ok"})
	}
	events = append(events, Event{Time: at, UserID: "u4", IP: "2001:db8:1:3::1", Outcome: "ok"})
	s := Aggregate("2026-03-08", events, Lines{})
	if got := s.IPs["2001:db8:1:2::/64"]; got.Users != 3 || got.Attempts != 3 {
		t.Errorf("the /64 = %+v, want 3 users and 3 attempts", got)
	}
	if got := s.IPs["2001:db8:1:3::/64"]; got.Users != 1 {
		t.Errorf("the other /64 = %+v, want 1 user", got)
	}
	if s.Service.IPs != 2 {
		t.Errorf("service IPs %d, want 2", s.Service.IPs)
	}
}

// TestAggregateLineFromTheEventsPlan: a user's line comes from the plan
// their requests were made under, so JWT users, who have no stored plan,
// get one too; events without a plan fall back to the stored user's plan.
func TestAggregateLineFromTheEventsPlan(t *testing.T) {
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	lines := Lines{ByPlan: map[string]int64{"free": 50, "pro": 500, "open": 0}, ByUser: map[string]int64{"key-user": 50, "moved": 50}}
	events := []Event{
		{Time: at, UserID: "jwt-user", Plan: "pro", Outcome: "ok"},               // known only by its events
		{Time: at, UserID: "key-user", Outcome: "ok"},                            // an older event: no plan
		{Time: at, UserID: "moved", Plan: "free", Outcome: "ok"},                 // moved to pro during the day:
		{Time: at.Add(time.Minute), UserID: "moved", Plan: "pro", Outcome: "ok"}, // the last plan counts
		{Time: at, UserID: "unlimited", Plan: "open", Outcome: "ok"},             // a plan without a line
		{Time: at, UserID: "gone", Plan: "deleted-plan", Outcome: "ok"},          // a plan no longer in config
	}
	s := Aggregate("2026-03-08", events, lines)
	for user, want := range map[string]int64{"jwt-user": 500, "key-user": 50, "moved": 500, "unlimited": 0, "gone": 0} {
		if got := s.Users[user].Line; got != want {
			t.Errorf("%s: line %d, want %d", user, got, want)
		}
	}
}
