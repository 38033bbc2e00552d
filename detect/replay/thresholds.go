package replay

import (
	"math"
	"slices"
	"strings"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
)

// Margin is how far above the highest unflagged peak a suggested line
// lies: half as much again, and at least one more.
const Margin = 0.5

// Measures of Thresholds, as in ThresholdLayer.Layer.
const (
	MeasureRate        = "rate"          // requests per user in any window of [limits.user] window
	MeasureBurst       = "burst"         // requests per user in any second
	MeasureDaily       = "daily"         // attempts per user per day
	MeasureInvites     = "invites"       // invite checks per client key in any window of [invites] window
	MeasureInviteBurst = "invites_burst" // invite checks per client key in any second
	MeasureFailIP      = "fail_ip"       // consecutive refused invite checks per client key
	MeasureFailEmail   = "fail_email"    // consecutive refused invite checks per e-mail
)

// Windows are the lengths Thresholds measures rates over: the config in
// force's.
type Windows struct {
	User, Invites time.Duration
}

// ThresholdReport is what Thresholds found.
type ThresholdReport struct {
	From   string           `json:"from"`
	To     string           `json:"to"`
	Margin string           `json:"margin"`
	Layers []ThresholdLayer `json:"layers"`
}

// ThresholdLayer is one measure's distribution over keys, each key
// counted by its peak, for the keys a detector flagged and for the rest,
// and the line suggested for it.
type ThresholdLayer struct {
	Layer     string       `json:"layer"`
	Measure   string       `json:"measure"`
	Unflagged Distribution `json:"unflagged"`
	Flagged   Distribution `json:"flagged"`
	// Suggested is the least line that refuses none of the unflagged
	// keys, with Margin; 0 when no unflagged key was seen.
	Suggested int64 `json:"suggested"`
}

// Distribution is the p50 to max of the keys' peaks (nearest rank).
type Distribution struct {
	Keys int     `json:"keys"`
	P50  int64   `json:"p50"`
	P90  int64   `json:"p90"`
	P99  int64   `json:"p99"`
	P999 int64   `json:"p99_9"`
	Max  int64   `json:"max"`
	peak []int64 // sorted
}

func distribution(peaks []int64) Distribution {
	slices.Sort(peaks)
	d := Distribution{Keys: len(peaks), peak: peaks}
	if len(peaks) == 0 {
		return d
	}
	rank := func(p float64) int64 {
		i := int(math.Ceil(p*float64(len(peaks)))) - 1
		return peaks[max(0, min(i, len(peaks)-1))]
	}
	d.P50, d.P90, d.P99, d.P999, d.Max = rank(0.5), rank(0.9), rank(0.99), rank(0.999), peaks[len(peaks)-1]
	return d
}

// suggest is the line above every unflagged peak, with Margin.
func suggest(d Distribution) int64 {
	if d.Keys == 0 {
		return 0
	}
	return max(int64(math.Ceil(float64(d.Max)*(1+Margin))), d.Max+1)
}

// peakIn is the most of times (sorted) within any interval of length w.
func peakIn(times []time.Time, w time.Duration) int64 {
	var best, lo int
	for hi := range times {
		for !times[hi].Before(times[lo].Add(w)) {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return int64(best)
}

// Thresholds measures the recorded traffic of events as the layers
// count it, per key (each key by its peak), apart for the subjects of
// findings and the rest, and suggests lines.
func Thresholds(events []detect.Event, findings []detect.Finding, w Windows, from, to string, loc *time.Location) ThresholdReport {
	flagged := map[string]bool{}
	for _, f := range findings {
		flagged[f.Subject] = true
	}
	in, _ := arrivals(events)
	users, ips := map[string][]time.Time{}, map[string][]time.Time{}
	daily := map[string]map[string]int64{}
	for _, a := range in {
		if strings.HasPrefix(a.route, detect.RoutePrefix) {
			continue // a guarded route's request is no OCR request
		}
		if a.route == detect.RouteInvite {
			ips[a.key] = append(ips[a.key], a.at)
			continue
		}
		users[a.key] = append(users[a.key], a.at)
		if a.attempt {
			if daily[a.key] == nil {
				daily[a.key] = map[string]int64{}
			}
			daily[a.key][budget.DayKey(a.at, loc)]++
		}
	}
	ipRuns, emailRuns := failRuns(events)

	w.User, w.Invites = max(w.User, limiter.MinWindow), max(w.Invites, limiter.MinWindow)
	rep := ThresholdReport{From: from, To: to, Margin: "50% above the highest unflagged peak, and at least one more"}
	add := func(layer, measure string, peaks map[string]int64) {
		var un, fl []int64
		for k, p := range peaks {
			if flagged[k] {
				fl = append(fl, p)
			} else {
				un = append(un, p)
			}
		}
		l := ThresholdLayer{Layer: layer, Measure: measure, Unflagged: distribution(un), Flagged: distribution(fl)}
		l.Suggested = suggest(l.Unflagged)
		rep.Layers = append(rep.Layers, l)
	}
	perKey := func(times map[string][]time.Time, d time.Duration) map[string]int64 {
		out := make(map[string]int64, len(times))
		for k, ts := range times {
			out[k] = peakIn(ts, d)
		}
		return out
	}
	add(MeasureRate, "requests per user in any "+w.User.String(), perKey(users, w.User))
	add(MeasureBurst, "requests per user in any second", perKey(users, time.Second))
	peakDay := map[string]int64{}
	for u, days := range daily {
		for _, n := range days {
			peakDay[u] = max(peakDay[u], n)
		}
	}
	add(MeasureDaily, "attempts per user per day", peakDay)
	add(MeasureInvites, "invite checks per client IP in any "+w.Invites.String(), perKey(ips, w.Invites))
	add(MeasureInviteBurst, "invite checks per client IP in any second", perKey(ips, time.Second))
	add(MeasureFailIP, "consecutive refused invite checks per client IP", ipRuns)
	add(MeasureFailEmail, "consecutive refused invite checks per e-mail", emailRuns)
	return rep
}

// failRuns is, per client key and per e-mail, the longest run of refused
// invite checks without a check that passed between them. Refusals are
// stored in rows per window, so a run is the sum of the rows between two
// passes; cooldown refusals count too, so a run may be longer than the
// failures the fail limit counted.
func failRuns(events []detect.Event) (ips, emails map[string]int64) {
	ips, emails = map[string]int64{}, map[string]int64{}
	runIP, runEmail := map[string]int64{}, map[string]int64{}
	step := func(runs, best map[string]int64, key string, refused int64) {
		if key == "" || key == detect.Other {
			return
		}
		if refused == 0 {
			runs[key] = 0
			best[key] = max(best[key], 0)
			return
		}
		runs[key] += refused
		best[key] = max(best[key], runs[key])
	}
	sorted := slices.Clone(events)
	slices.SortStableFunc(sorted, func(a, b detect.Event) int { return a.Time.Compare(b.Time) })
	for _, e := range sorted {
		if e.Route != detect.RouteInvite || e.Layer != "" {
			continue
		}
		switch {
		case e.Outcome == "ok" && e.Count == 0:
			step(runIP, ips, limiter.ClientKey(e.IP), 0)
			step(runEmail, emails, e.UserID, 0)
		case e.Outcome == detect.OutcomeRefused && e.IP != "":
			step(runIP, ips, limiter.ClientKey(e.IP), e.N())
		case e.Outcome == detect.OutcomeRefused && e.UserID != "":
			step(runEmail, emails, e.UserID, e.N())
		}
	}
	return ips, emails
}
