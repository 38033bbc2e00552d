package replay

import (
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/limiter"
)

var t0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// Rows of refusals are spread over their window, invite checks keyed by
// client key, shadow rows skipped (their requests have events of their
// own), and lost events counted.
func TestRunReadsEveryKindOfRow(t *testing.T) {
	events := []detect.Event{
		{Time: t0, UserID: "alice", Plan: "free", Route: ocrRoute, Outcome: "ok"},
		{Time: t0, UserID: "alice", Plan: "free", Route: ocrRoute, Layer: LayerRate, Outcome: detect.OutcomeLayerRefused, Count: 30},
		{Time: t0.Add(time.Second), UserID: "alice", Plan: "free", Route: ocrRoute, Layer: LayerRate, Outcome: detect.OutcomeShadowRefused, Count: 5},
		{Time: t0, IP: "2001:db8::1", Route: detect.RouteInvite, Outcome: "ok"},
		{Time: t0, IP: "2001:db8::2", Route: detect.RouteInvite, Layer: LayerInvites, Outcome: detect.OutcomeLayerRefused, Count: 4},
		{Time: t0, IP: "2001:db8::/64", Route: detect.RouteInvite, Outcome: detect.OutcomeRefused, Count: 3},
		{Time: t0, Route: detect.RouteInvite, Outcome: "invalid", Count: 3}, // the service's reason row
		{Time: t0, Outcome: detect.OutcomeDropped, Count: 7},
	}
	loose := Limits{User: limiter.Config{Rate: 1000, Window: time.Minute}, Invites: limiter.Config{Rate: 1000, Window: time.Minute}}
	tight := Limits{
		User:    limiter.Config{Rate: 10, Window: time.Minute},
		Lines:   map[string]int64{"free": 5},
		Invites: limiter.Config{Rate: 2, Window: time.Hour},
	}
	rep, err := Run(events, loose, tight, "2026-11-20", "2026-11-20", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DroppedEvents != 7 {
		t.Errorf("dropped %d, want 7", rep.DroppedEvents)
	}
	want := map[string][3]int64{ // requests, current refused, candidate refused
		LayerRate:    {31, 0, 21},
		LayerDaily:   {31, 0, 5}, // 10 pass the rate limit, 5 fit the line
		LayerInvites: {8, 0, 6},
	}
	for _, l := range rep.Layers {
		w := want[l.Layer]
		if l.Current.Requests != w[0] || l.Current.Refused != w[1] || l.Candidate.Refused != w[2] {
			t.Errorf("%s: requests %d, refused %d / %d; want %v", l.Layer, l.Current.Requests, l.Current.Refused, l.Candidate.Refused, w)
		}
	}
	inv := rep.Layers[2].Candidate
	if inv.KeysRefused != 1 || inv.Top[0].Key != "2001:db8::/64" {
		t.Errorf("invites refused %+v, want one /64", inv)
	}
	if len(rep.Differences) != 3 {
		t.Errorf("differences %q, want one per layer", rep.Differences)
	}
}
