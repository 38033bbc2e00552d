package detect

import (
	"testing"
	"time"
)

// A guarded route's events are not OCR attempts: the day's figures leave
// them out.
func TestAggregatorLeavesRouteEventsOut(t *testing.T) {
	a := NewAggregator("2026-03-10", Lines{}, 0)
	at := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	a.Add(Event{Time: at, UserID: "alice", IP: "192.0.2.1", Route: RoutePrefix + "checkout", Outcome: "ok", Status: 201})
	a.Add(Event{Time: at, IP: "192.0.2.1", Route: RoutePrefix + "referral", Outcome: OutcomeCooldownStarted})
	if got := a.s.Service.Attempts; got != 0 {
		t.Errorf("service attempts %d, want 0", got)
	}
	if _, ok := a.s.Users["alice"]; ok {
		t.Error("a route event made alice a user of the day")
	}
	a.Add(Event{Time: at, UserID: "alice", IP: "192.0.2.1", Route: "/v1/ocr", Outcome: "ok"})
	if got := a.s.Service.Attempts; got != 1 {
		t.Errorf("service attempts %d, want the OCR one", got)
	}
}
