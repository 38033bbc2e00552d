package replay

import (
	"fmt"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/limiter"
)

var t0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// Rows of refusals are spread over their window, invite checks keyed by
// client key, shadow rows skipped (their requests have events of their
// own), and lost events counted. The refusals recorded by a first layer
// stand under the current config's limits (whose layers made them) and
// reach no later layer; the candidate's other limits judge them anew.
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
	want := map[string][4]int64{ // requests and refused, current then candidate
		// Under the candidate 5 pass the rate limit and fit the line; the
		// 6th passes the rate limit and meets the line, and from then on
		// the deny cache refuses alice at the line before layer 1.
		LayerRate:    {31, 30, 6, 0},
		LayerDaily:   {1, 0, 31, 26},
		LayerInvites: {8, 4, 8, 6},
	}
	for _, l := range rep.Layers {
		w := want[l.Layer]
		if got := [4]int64{l.Current.Requests, l.Current.Refused, l.Candidate.Requests, l.Candidate.Refused}; got != w {
			t.Errorf("%s: requests and refused %v, want %v", l.Layer, got, w)
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

// A guarded route's requests go through that route's limits alone, keyed
// as the route counts them (user id, or "ip:" and the client key); its
// refusal rows are spread like the others and its cooldown starts are no
// requests. A route only the candidate has sees nothing under the
// current config.
func TestRunReplaysGuardedRoutes(t *testing.T) {
	checkout, contact := RouteLayer("checkout"), RouteLayer("contact")
	var events []detect.Event
	for i := range 6 {
		at := t0.Add(time.Duration(i) * time.Second)
		events = append(events,
			detect.Event{Time: at, UserID: "alice", IP: "192.0.2.1", Route: checkout, Outcome: "ok"},
			detect.Event{Time: at, IP: "2001:db8::1", Route: contact, Outcome: "failure"},
		)
	}
	events = append(events,
		detect.Event{Time: t0, UserID: "alice", IP: "192.0.2.1", Route: checkout, Outcome: detect.OutcomeCooldownStarted},
		detect.Event{Time: t0, IP: "2001:db8::2", Route: contact, Layer: "rate", Outcome: detect.OutcomeLayerRefused, Count: 4},
	)
	loose := Limits{User: limiter.Config{Rate: 1000, Window: time.Minute}, Invites: limiter.Config{Rate: 1000, Window: time.Minute},
		Routes: map[string]RouteLimits{"checkout": {Limits: limiter.Config{Rate: 1000, Window: time.Minute}}}}
	tight := loose
	tight.Routes = map[string]RouteLimits{
		"checkout": {Limits: limiter.Config{Rate: 1000, Window: time.Minute}, Daily: 2},
		"contact":  {ByIP: true, Limits: limiter.Config{Rate: 3, Window: time.Hour}},
	}
	rep, err := Run(events, loose, tight, "2026-11-20", "2026-11-20", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range rep.Layers {
		got[l.Layer] = fmt.Sprintf("%d/%d %d/%d %v", l.Current.Requests, l.Current.Refused, l.Candidate.Requests, l.Candidate.Refused, l.Candidate.Top)
	}
	want := map[string]string{
		LayerRate:    "0/0 0/0 []",
		LayerDaily:   "0/0 0/0 []",
		LayerInvites: "0/0 0/0 []",
		checkout:     "6/0 6/4 [{alice 4}]",
		// The /64 is one client: 10 requests, 3 an hour pass.
		contact: "0/0 10/7 [{ip:2001:db8::/64 7}]",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("layers\n got %v\nwant %v", got, want)
	}
	wantNotes := []string{NoteInviteFails, "rate: " + NoteNoTraffic, "attempts: " + NoteNoTraffic, "invites: " + NoteNoTraffic}
	if fmt.Sprint(rep.Notes) != fmt.Sprint(wantNotes) {
		t.Errorf("notes %q, want %q", rep.Notes, wantNotes)
	}
	for _, l := range rep.Layers {
		if got, want := l.Note != "", l.Layer == LayerRate || l.Layer == LayerDaily || l.Layer == LayerInvites; got != want {
			t.Errorf("%s: note %q, want one: %v", l.Layer, l.Note, want)
		}
	}
}

// Thresholds measure OCR requests only: a guarded route's requests are
// not a user's OCR rate.
func TestThresholdsLeaveRoutesOut(t *testing.T) {
	var events []detect.Event
	for i := range 50 {
		events = append(events, detect.Event{Time: t0.Add(time.Duration(i) * time.Second), UserID: "alice", Route: RouteLayer("checkout"), Outcome: "ok"})
	}
	rep := Thresholds(events, nil, Windows{User: time.Minute, Invites: time.Minute}, "2026-11-20", "2026-11-20", time.UTC)
	for _, l := range rep.Layers {
		if l.Unflagged.Keys != 0 {
			t.Errorf("%s: %d keys measured from route traffic, want none", l.Layer, l.Unflagged.Keys)
		}
	}
}

// A layer's figures count only the requests that reached it: of a user's
// 2 attempts and 9 requests the rate limit refused before the daily line,
// the line sees 2 under the limits that refused them, whatever the
// candidate's line.
func TestDailyLineCountsWhatReachedIt(t *testing.T) {
	events := []detect.Event{
		{Time: t0, UserID: "bob", Plan: "free", Route: ocrRoute, Layer: LayerRate, Outcome: detect.OutcomeLayerRefused, Count: 9},
		{Time: t0.Add(time.Second), UserID: "bob", Plan: "free", Route: ocrRoute, Outcome: "ok"},
		{Time: t0.Add(2 * time.Second), UserID: "bob", Plan: "free", Route: ocrRoute, Outcome: "ok"},
	}
	// Burst 5 a second: spread over the minute, the 9 refusals would
	// all pass it, were they judged again.
	current := Limits{User: limiter.Config{Rate: 100, Window: time.Minute, Burst: 5}, Lines: map[string]int64{"free": 100}, Invites: limiter.Config{Rate: 10, Window: time.Minute}}
	candidate := current
	candidate.Lines = map[string]int64{"free": 1}
	rep, err := Run(events, current, candidate, "2026-11-20", "2026-11-20", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range rep.Layers {
		got[l.Layer] = fmt.Sprintf("%d/%d %d/%d", l.Current.Requests, l.Current.Refused, l.Candidate.Requests, l.Candidate.Refused)
	}
	if got[LayerRate] != "11/9 11/9" || got[LayerDaily] != "2/0 2/1" {
		t.Errorf("rate %s, daily line %s; want 11/9 11/9 and 2/0 2/1", got[LayerRate], got[LayerDaily])
	}
	th := Thresholds(events, nil, Windows{User: time.Minute, Invites: time.Minute}, "2026-11-20", "2026-11-20", time.UTC)
	for _, l := range th.Layers {
		if l.Layer == MeasureDaily && (l.Flagged.Max != 2 || l.Flagged.Keys != 1) {
			t.Errorf("attempts per user per day %+v, want bob at 2 (left out: the limits refused him)", l.Flagged)
		}
	}
}

// A row is replayed as a count: a million refusals in one row take the
// limiter a few calls (a refusal's retry-after covers the requests that
// follow it), and decide as the requests one by one would.
func TestRowReplayedAsACount(t *testing.T) {
	const n = 1_000_000
	row := detect.Event{Time: t0, IP: "192.0.2.9", Route: detect.RouteInvite, Layer: LayerInvites, Outcome: detect.OutcomeLayerRefused, Count: n}
	current := Limits{User: limiter.Config{Rate: 10, Window: time.Minute}, Invites: limiter.Config{Rate: 100_000, Window: time.Minute}}
	candidate := current
	candidate.Invites = limiter.Config{Rate: 10, Window: 10 * time.Second, Burst: 3}
	rep, err := Run([]detect.Event{row}, current, candidate, "2026-11-20", "2026-11-20", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	inv := rep.Layers[2]
	// The candidate admits 3 a second up to 10 in any 10 s: 10 per 10 s
	// window over the minute, 60 in all.
	if inv.Current.Requests != n || inv.Current.Refused != n || inv.Candidate.Requests != n || inv.Candidate.Refused != n-60 {
		t.Errorf("invites %+v / %+v, want all %d refused as recorded, and all but 60 by the candidate", inv.Current, inv.Candidate, n)
	}
	// The same decisions as requests one by one.
	lim, _ := limiter.New(candidate.Invites)
	u := unit{start: t0.UnixNano(), span: int64(detect.RefusalWindow), n: n}
	admitted := 0
	for i := range int64(n) {
		if lim.Allow("ip:x", time.Unix(0, u.at(i))) == nil {
			admitted++
		}
	}
	if admitted != 60 {
		t.Errorf("one by one, %d admitted; the replay admitted %d", admitted, n-inv.Candidate.Refused)
	}
}

// A row of cached answers stands for its Count requests, spread over its
// minute: they pass layer 1 (the rate limit counts them) and go no
// further.
func TestRunSpreadsCachedRows(t *testing.T) {
	events := []detect.Event{
		{Time: t0, UserID: "alice", Plan: "free", Route: ocrRoute, Outcome: "ok"},
		{Time: t0, UserID: "alice", Plan: "free", Route: ocrRoute, Outcome: detect.OutcomeCached, Status: 200, Count: 20},
		{Time: t0.Add(time.Minute), UserID: "alice", Plan: "free", Route: ocrRoute, Outcome: detect.OutcomeReplayed, Status: 200}, // one apiece, as older versions stored them
	}
	loose := Limits{User: limiter.Config{Rate: 1000, Window: time.Minute}, Invites: limiter.Config{Rate: 1000, Window: time.Minute}}
	tight := Limits{User: limiter.Config{Rate: 10, Window: time.Hour}, Lines: map[string]int64{"free": 5}, Invites: loose.Invites}
	rep, err := Run(events, loose, tight, "2026-11-20", "2026-11-20", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.Layers {
		switch l.Layer {
		case LayerRate:
			if l.Current.Requests != 22 || l.Candidate.Refused != 12 {
				t.Errorf("rate: %d requests, %d refused by the candidate; want 22 and 12", l.Current.Requests, l.Candidate.Refused)
			}
		case LayerDaily:
			if l.Candidate.Refused != 0 {
				t.Errorf("daily line: %d refused, want none (cached answers are no attempts)", l.Candidate.Refused)
			}
		}
	}
}
