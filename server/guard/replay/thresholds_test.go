package replay

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"breakwater/detect"
)

// On a day of normal users and a bot, flagged by the real detectors, the
// suggested rate line lies above every normal user's peak and below the
// bot's rate.
func TestThresholdsSeparateABot(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	var events []detect.Event
	normalPeak := int64(0)
	for u := range 40 {
		user := "user" + string(rune('A'+u))
		var times []time.Time
		at := day.Add(time.Duration(rng.IntN(8*3600)) * time.Second)
		for range 10 + rng.IntN(30) {
			at = at.Add(time.Duration(5+rng.IntN(300)) * time.Second)
			times = append(times, at)
			events = append(events, detect.Event{Time: at, UserID: user, Plan: "free", IP: "192.0.2." + string(rune('0'+u%10)), Route: ocrRoute, Outcome: "ok"})
		}
		normalPeak = max(normalPeak, peakIn(times, time.Minute))
	}
	// The bot: two requests a second for twenty minutes, 120 a minute.
	at := day.Add(10 * time.Hour)
	for range 2400 {
		at = at.Add(500 * time.Millisecond)
		events = append(events, detect.Event{Time: at, UserID: "bot", Plan: "free", IP: "198.51.100.7", Route: ocrRoute, Outcome: "ok"})
	}
	slices.SortStableFunc(events, func(a, b detect.Event) int { return a.Time.Compare(b.Time) })

	agg := detect.NewAggregator("2026-11-20", detect.Lines{ByPlan: map[string]int64{"free": 3000}}, 0)
	for _, e := range events {
		agg.Add(e)
	}
	findings := detect.Detect(detect.Config{}, detect.History{Today: agg.Done()})
	if !slices.ContainsFunc(findings, func(f detect.Finding) bool { return f.Subject == "bot" }) {
		t.Fatalf("the detectors did not flag the bot: %+v", findings)
	}
	for _, f := range findings {
		if f.Subject != "bot" && f.Subject != "198.51.100.7" && f.Subject != "service" {
			t.Fatalf("a normal user was flagged: %+v", f)
		}
	}

	rep := Thresholds(events, findings, Windows{User: time.Minute, Invites: 10 * time.Minute}, "2026-11-20", "2026-11-20", time.UTC)
	rate := rep.Layers[0]
	if rate.Layer != MeasureRate {
		t.Fatalf("first layer %q", rate.Layer)
	}
	if rate.Unflagged.Keys != 40 || rate.Flagged.Keys != 1 || rate.Unflagged.Max != normalPeak || rate.Flagged.Max != 120 {
		t.Errorf("rate distribution %+v / %+v, want 40 normal keys peaking at %d and the bot at 120", rate.Unflagged, rate.Flagged, normalPeak)
	}
	if !(rate.Suggested > normalPeak && rate.Suggested < 120) {
		t.Errorf("suggested rate %d, want above every normal peak (%d) and below the bot's 120 a minute", rate.Suggested, normalPeak)
	}
	if p := rate.Unflagged; !(p.P50 <= p.P90 && p.P90 <= p.P99 && p.P99 <= p.P999 && p.P999 <= p.Max) {
		t.Errorf("percentiles out of order: %+v", p)
	}
}

// The longest run of refused invite checks between passes, per IP and
// per e-mail, from the tally rows.
func TestFailRuns(t *testing.T) {
	t0 := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	ev := func(min int, ip, email, outcome string, n int64) detect.Event {
		return detect.Event{Time: t0.Add(time.Duration(min) * time.Minute), IP: ip, UserID: email, Route: detect.RouteInvite, Outcome: outcome, Count: n}
	}
	ips, emails := failRuns([]detect.Event{
		ev(0, "192.0.2.1", "", detect.OutcomeRefused, 3),
		ev(0, "", "a@example.com", detect.OutcomeRefused, 3),
		ev(1, "192.0.2.1", "a@example.com", "ok", 0),
		ev(15, "192.0.2.1", "", detect.OutcomeRefused, 2),
		ev(30, "192.0.2.1", "", detect.OutcomeRefused, 2),
	})
	if ips["192.0.2.1"] != 4 || emails["a@example.com"] != 3 {
		t.Errorf("runs %v %v, want 4 for the IP, 3 for the e-mail", ips, emails)
	}
}

// A row counts as its requests spread over its window: the peaks from
// rows are those of the requests one by one, never above, and at most a
// request or two below where rows and single requests mix.
func TestPeaksOfRowsMatchTheRequests(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 50 {
		var events []detect.Event
		times := map[string][]time.Time{}
		for range 40 {
			user := "u" + string(rune('a'+rng.IntN(3)))
			at := t0.Add(time.Duration(rng.IntN(20*60)) * time.Second)
			e := detect.Event{Time: at, UserID: user, Plan: "free", Route: ocrRoute, Outcome: "ok"}
			if rng.IntN(3) == 0 {
				e.Time = at.Truncate(detect.RefusalWindow)
				e.Layer, e.Outcome, e.Count = LayerRate, detect.OutcomeLayerRefused, int64(1+rng.IntN(200))
				u, _, _ := unitOf(e)
				for i := range u.n {
					times[user] = append(times[user], time.Unix(0, u.at(i)))
				}
			} else {
				times[user] = append(times[user], at)
			}
			events = append(events, e)
		}
		w := time.Duration(1+rng.IntN(300)) * time.Second
		rep := Thresholds(events, nil, Windows{User: w, Invites: time.Minute}, "", "", time.UTC)
		var want int64
		for _, ts := range times {
			slices.SortFunc(ts, time.Time.Compare)
			want = max(want, peakIn(ts, max(w, time.Second)))
		}
		got := max(rep.Layers[0].Unflagged.Max, rep.Layers[0].Flagged.Max)
		if got > want || got < want-2 {
			t.Fatalf("round %d, window %s: peak %d from rows, %d from the requests", round, w, got, want)
		}
	}
}

// A flood from one address that the invite rate limit refused is left
// out of the suggested invite line, and the report says so.
func TestThresholdsLeaveOutAFlood(t *testing.T) {
	var events []detect.Event
	for m := range 11 {
		events = append(events, detect.Event{Time: t0.Add(time.Duration(m) * time.Minute), IP: "203.0.113.5", Route: detect.RouteInvite,
			Layer: LayerInvites, Outcome: detect.OutcomeLayerRefused, Count: 70_000})
	}
	for i := range 5 {
		events = append(events, detect.Event{Time: t0.Add(time.Duration(i) * time.Minute), IP: "192.0.2.1", Route: detect.RouteInvite, Outcome: "ok"})
	}
	events = append(events, detect.Event{Time: t0, IP: "192.0.2.7", Route: detect.RouteInvite, Outcome: detect.OutcomeCooldownStarted})
	rep := Thresholds(events, nil, Windows{User: time.Minute, Invites: 10 * time.Minute}, "", "", time.UTC)
	inv := rep.Layers[3]
	if inv.Layer != MeasureInvites {
		t.Fatalf("layer %q", inv.Layer)
	}
	if inv.Suggested != 8 || inv.Unflagged.Max != 5 {
		t.Errorf("suggested %d over %+v, want 8 over the one address at 5", inv.Suggested, inv.Unflagged)
	}
	if inv.Flagged.Keys != 1 || inv.Flagged.Max < 600_000 || inv.LeftOut[LeftRefused] != 1 {
		t.Errorf("left out %+v %v, want the flood, refused by a limit", inv.Flagged, inv.LeftOut)
	}
}

// A key is left out of a layer's line for refusals at that layer or one
// before it: a user the daily line refused still counts for the rate.
func TestLeftOutByLayer(t *testing.T) {
	events := []detect.Event{
		{Time: t0, UserID: "heavy", Plan: "free", Route: ocrRoute, Outcome: "ok"},
		{Time: t0, UserID: "heavy", Plan: "free", Route: ocrRoute, Layer: LayerDaily, Outcome: detect.OutcomeLayerRefused, Count: 4},
		{Time: t0, UserID: "fast", Plan: "free", Route: ocrRoute, Outcome: "ok"},
		{Time: t0, UserID: "fast", Plan: "free", Route: ocrRoute, Layer: LayerRate, Outcome: detect.OutcomeLayerRefused, Count: 4},
		{Time: t0, UserID: "shadowed", Plan: "free", Route: ocrRoute, Outcome: "ok"},
		{Time: t0, UserID: "shadowed", Plan: "free", Route: ocrRoute, Layer: LayerRate, Outcome: detect.OutcomeShadowRefused, Count: 1},
	}
	rep := Thresholds(events, nil, Windows{User: time.Minute, Invites: time.Minute}, "", "", time.UTC)
	for _, l := range rep.Layers {
		want := map[string][2]int{MeasureRate: {2, 1}, MeasureBurst: {2, 1}, MeasureDaily: {1, 2}}[l.Layer]
		if want == [2]int{} {
			continue
		}
		if got := [2]int{l.Unflagged.Keys, l.Flagged.Keys}; got != want || l.LeftOut[LeftRefused] != want[1] {
			t.Errorf("%s: measured and left out %v %v, want %v", l.Layer, got, l.LeftOut, want)
		}
	}
}
