package replay

import (
	"container/heap"
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
// counted by its peak, for the keys left out (a detector flagged them, or
// the limits marked them in the range: see LeftOut) and for the rest, and
// the line suggested for it.
type ThresholdLayer struct {
	Layer     string       `json:"layer"`
	Measure   string       `json:"measure"`
	Unflagged Distribution `json:"unflagged"`
	// Flagged are the keys left out of the suggestion.
	Flagged Distribution `json:"flagged"`
	// LeftOut says why each key of Flagged is left out, by reason (one
	// per key, the first of LeftDetector, LeftCooldown, LeftRefused that
	// holds).
	LeftOut map[string]int `json:"left_out"`
	// Suggested is the least line that refuses none of the unflagged
	// keys, with Margin; 0 when no unflagged key was seen.
	Suggested int64 `json:"suggested"`
}

// Reasons a key is left out of a suggested line, as in
// ThresholdLayer.LeftOut.
const (
	// LeftDetector: a detector flagged the key (a finding of a day in
	// the range names it).
	LeftDetector = "flagged by a detector"
	// LeftCooldown: the key started a cooldown of the invite fail limit.
	LeftCooldown = "cooled down"
	// LeftRefused: a limit refused the key's requests (for real, not in
	// shadow mode) at the layer measured or one before it.
	LeftRefused = "refused by a limit"
)

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

// Measurer measures recorded events, added one at a time in time
// order, as the layers count them. A row of refusals counts as its
// requests spread over its window, held as one value: the memory is that
// of the keys seen and of the rows within a window of each, however many
// requests the rows count.
type Measurer struct {
	w                    Windows
	loc                  *time.Location
	rate, burst          *peaks
	invites, inviteBurst *peaks
	daily                map[string]*dayCount
	fails                *failRunner
	// Keys the limits marked, with why: users refused by layer 1, and
	// by the daily line (which comes after it), client keys and e-mails.
	users, usersDaily, ips, emails map[string]string
}

// dayCount is one user's attempts on the day counted, and their peak.
type dayCount struct {
	day     string
	n, peak int64
}

// NewMeasurer measures with the windows of w, days in loc.
func NewMeasurer(w Windows, loc *time.Location) *Measurer {
	w.User, w.Invites = max(w.User, limiter.MinWindow), max(w.Invites, limiter.MinWindow)
	return &Measurer{
		w: w, loc: loc,
		rate: newPeaks(w.User), burst: newPeaks(time.Second),
		invites: newPeaks(w.Invites), inviteBurst: newPeaks(time.Second),
		daily: map[string]*dayCount{}, fails: newFailRunner(),
		users: map[string]string{}, usersDaily: map[string]string{}, ips: map[string]string{}, emails: map[string]string{},
	}
}

// mark records why the limits mark key; a cooldown outranks a refusal.
func mark(m map[string]string, key, why string) {
	if key == "" || key == detect.Other || m[key] == LeftCooldown {
		return
	}
	m[key] = why
}

// Add measures e; events come in time order.
func (m *Measurer) Add(e detect.Event) {
	m.fails.add(e)
	switch {
	case e.Route == detect.RouteInvite && e.Outcome == detect.OutcomeCooldownStarted:
		mark(m.ips, limiter.ClientKey(e.IP), LeftCooldown)
		mark(m.emails, e.UserID, LeftCooldown)
	case e.Route == detect.RouteInvite && e.Outcome == detect.OutcomeLayerRefused:
		mark(m.ips, limiter.ClientKey(e.IP), LeftRefused)
	case e.Route == ocrRoute && e.Outcome == detect.OutcomeLayerRefused && e.Layer == LayerRate:
		mark(m.users, e.UserID, LeftRefused)
		mark(m.usersDaily, e.UserID, LeftRefused)
	case e.Route == ocrRoute && e.Outcome == detect.OutcomeLayerRefused && e.Layer == LayerDaily:
		mark(m.usersDaily, e.UserID, LeftRefused)
	}
	u, ok, _ := unitOf(e)
	if !ok || strings.HasPrefix(u.route, detect.RoutePrefix) {
		return // a guarded route's request is no OCR request
	}
	if u.route == detect.RouteInvite {
		m.invites.add(u.key, u)
		m.inviteBurst.add(u.key, u)
		return
	}
	m.rate.add(u.key, u)
	m.burst.add(u.key, u)
	// The daily line counts the attempts that reached it: not the
	// requests layer 1 refused before it, nor reads from storage.
	if u.attempt && u.refusedBy != LayerRate {
		day := budget.DayKey(time.Unix(0, u.start), m.loc)
		d := m.daily[u.key]
		if d == nil {
			d = &dayCount{}
			m.daily[u.key] = d
		}
		if d.day != day {
			d.day, d.n = day, 0
		}
		d.n += u.n
		d.peak = max(d.peak, d.n)
	}
}

// Report finishes the measures of the days from to to; the keys the
// findings name are left out of the suggestions, as are those the limits
// marked.
func (m *Measurer) Report(findings []detect.Finding, from, to string) ThresholdReport {
	flagged := map[string]bool{}
	for _, f := range findings {
		flagged[f.Subject] = true
		flagged[limiter.ClientKey(f.Subject)] = true
	}
	rep := ThresholdReport{From: from, To: to, Margin: "50% above the highest unflagged peak, and at least one more"}
	add := func(layer, measure string, peaks map[string]int64, marked map[string]string) {
		var un, fl []int64
		left := map[string]int{}
		for k, p := range peaks {
			why := marked[k]
			if flagged[k] {
				why = LeftDetector
			}
			if why == "" {
				un = append(un, p)
				continue
			}
			fl = append(fl, p)
			left[why]++
		}
		l := ThresholdLayer{Layer: layer, Measure: measure, Unflagged: distribution(un), Flagged: distribution(fl), LeftOut: left}
		l.Suggested = suggest(l.Unflagged)
		rep.Layers = append(rep.Layers, l)
	}
	add(MeasureRate, "requests per user in any "+m.w.User.String(), m.rate.done(), m.users)
	add(MeasureBurst, "requests per user in any second", m.burst.done(), m.users)
	peakDay := make(map[string]int64, len(m.daily))
	for u, d := range m.daily {
		peakDay[u] = d.peak
	}
	add(MeasureDaily, "attempts per user per day", peakDay, m.usersDaily)
	add(MeasureInvites, "invite checks per client IP in any "+m.w.Invites.String(), m.invites.done(), m.ips)
	add(MeasureInviteBurst, "invite checks per client IP in any second", m.inviteBurst.done(), m.ips)
	add(MeasureFailIP, "consecutive refused invite checks per client IP", m.fails.ips, m.ips)
	add(MeasureFailEmail, "consecutive refused invite checks per e-mail", m.fails.emails, m.emails)
	return rep
}

// Thresholds measures the recorded traffic of events (in any order) as
// the layers count it, per key (each key by its peak), apart for the
// keys left out (the subjects of findings, and the keys the limits
// marked) and the rest, and suggests lines.
func Thresholds(events []detect.Event, findings []detect.Finding, w Windows, from, to string, loc *time.Location) ThresholdReport {
	m := NewMeasurer(w, loc)
	for _, e := range inTimeOrder(events) {
		m.Add(e)
	}
	return m.Report(findings, from, to)
}

// peaks measures per key the most requests in any interval of length w,
// as the windows ending at each request counted; for a row spread over
// its window, those ending at its first and last request and just before
// either leaves the interval. The result is exact for single requests
// and an estimate, never above the truth, where rows overlap.
type peaks struct {
	w      int64
	keys   map[string]*track
	checks checkHeap
	now    int64
}

// track is one key's requests within the last interval, and its peak.
type track struct {
	points []int64 // single requests, in time order
	runs   []unit  // rows whose last request is within the interval
	best   int64
}

func newPeaks(w time.Duration) *peaks {
	return &peaks{w: int64(w), keys: map[string]*track{}}
}

// check is a deferred evaluation of key's window ending at c.
type check struct {
	c   int64
	key string
}

type checkHeap []check

func (h checkHeap) Len() int           { return len(h) }
func (h checkHeap) Less(i, j int) bool { return h[i].c < h[j].c }
func (h checkHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *checkHeap) Push(x any)        { *h = append(*h, x.(check)) }
func (h *checkHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// count is how many of t's requests lie in (c-w, c].
func (p *peaks) count(t *track, c int64) int64 {
	lo := c - p.w
	i, _ := slices.BinarySearch(t.points, lo+1)
	j, _ := slices.BinarySearch(t.points, c+1)
	n := int64(j - i)
	for k := range t.runs {
		r := &t.runs[k]
		n += r.index(c+1) - r.index(lo+1)
	}
	return n
}

// evaluate raises key's peak to the count of the window ending at c.
func (p *peaks) evaluate(key string, c int64) {
	if t := p.keys[key]; t != nil {
		t.best = max(t.best, p.count(t, c))
	}
}

// advance evaluates the deferred windows that end before now: every
// request at or before their end has been added.
func (p *peaks) advance(now int64) {
	for len(p.checks) > 0 && p.checks[0].c < now {
		c := heap.Pop(&p.checks).(check)
		p.evaluate(c.key, c.c)
	}
	p.now = now
}

func (p *peaks) add(key string, u unit) {
	p.advance(u.start)
	t := p.keys[key]
	if t == nil {
		t = &track{}
		p.keys[key] = t
	}
	// What ends at or before start-w counts in no window still to be
	// evaluated (none ends before start).
	cut := u.start - p.w
	if i, _ := slices.BinarySearch(t.points, cut+1); i > 0 {
		t.points = append(t.points[:0], t.points[i:]...)
	}
	t.runs = slices.DeleteFunc(t.runs, func(r unit) bool { return r.at(r.n-1) <= cut })
	if u.n == 1 {
		t.points = append(t.points, u.start)
		p.evaluate(key, u.start)
		return
	}
	u.arrival = arrival{} // the track keeps times, not names
	t.runs = append(t.runs, u)
	p.evaluate(key, u.start)
	last := u.at(u.n - 1)
	for _, c := range []int64{last, u.start + p.w - 1, last + p.w - 1} {
		heap.Push(&p.checks, check{c: c, key: key})
	}
}

// done evaluates what is deferred and returns each key's peak.
func (p *peaks) done() map[string]int64 {
	p.advance(math.MaxInt64)
	out := make(map[string]int64, len(p.keys))
	for k, t := range p.keys {
		out[k] = t.best
	}
	return out
}

// failRunner follows, per client key and per e-mail, the longest run of
// refused invite checks without a check that passed between them.
// Refusals are stored in rows per window, so a run is the sum of the rows
// between two passes; cooldown refusals count too, so a run may be longer
// than the failures the fail limit counted.
type failRunner struct {
	ips, emails     map[string]int64 // the longest runs
	runIP, runEmail map[string]int64 // the runs going on
}

func newFailRunner() *failRunner {
	return &failRunner{ips: map[string]int64{}, emails: map[string]int64{}, runIP: map[string]int64{}, runEmail: map[string]int64{}}
}

func (f *failRunner) add(e detect.Event) {
	if e.Route != detect.RouteInvite || e.Layer != "" {
		return
	}
	step := func(runs, best map[string]int64, key string, refused int64) {
		if key == "" || key == detect.Other {
			return
		}
		if refused == 0 {
			delete(runs, key)
			best[key] = max(best[key], 0)
			return
		}
		runs[key] += refused
		best[key] = max(best[key], runs[key])
	}
	switch {
	case e.Outcome == "ok" && e.Count == 0:
		step(f.runIP, f.ips, limiter.ClientKey(e.IP), 0)
		step(f.runEmail, f.emails, e.UserID, 0)
	case e.Outcome == detect.OutcomeRefused && e.IP != "":
		step(f.runIP, f.ips, limiter.ClientKey(e.IP), e.N())
	case e.Outcome == detect.OutcomeRefused && e.UserID != "":
		step(f.runEmail, f.emails, e.UserID, e.N())
	}
}

// failRuns is the longest runs of refused invite checks of events, in
// any order, per client key and per e-mail.
func failRuns(events []detect.Event) (ips, emails map[string]int64) {
	f := newFailRunner()
	for _, e := range inTimeOrder(events) {
		f.add(e)
	}
	return f.ips, f.emails
}
