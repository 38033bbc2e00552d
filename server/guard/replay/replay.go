// Package replay answers "what would these limits have refused?" from the
// recorded statistics events: Run replays them, in time order on a
// simulated clock, through the real limiter and budget types of two sets
// of limits (the config in force and a candidate) and compares what each
// refuses; Thresholds measures, per layer, what the limits count, and
// suggests lines. It reads events and writes nothing; it knows neither
// storage nor HTTP.
//
// Time resolution: a request that reached the upstream (or was answered
// from storage) is an event of its own, to the nanosecond. A request a
// layer refused before the call is in a row per minute and key
// (detect.RefusalWindow), and an invite check refused by the fail limit in
// a row per 15 minutes and IP: the replay spreads a row's requests evenly
// over its window, so decisions on them are estimates at that resolution.
// A row stays one value however many requests it counts (a Count per key
// and minute, of whatever outcome): Replayer and Measurer take events one
// at a time, in time order, and their memory follows the rows within a
// window and the keys, never the requests.
package replay

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
)

// Layers replayed, in the order of the pipeline.
const (
	LayerRate    = "rate"     // [limits.user], per user
	LayerDaily   = "attempts" // each plan's daily line, per user
	LayerInvites = "invites"  // the [invites] IP rate limit, per client key
)

// RouteLayer is the layer of a guarded route in a report, as in metrics:
// "route:NAME".
func RouteLayer(name string) string { return detect.RoutePrefix + name }

// NoteInviteFails says why the invite fail limit is not replayed.
const NoteInviteFails = "invites fail limit: not replayed: failed invite checks are stored as 15-minute tallies per IP and per e-mail that lose the order of failures and successes (and mix in refusals during a cooldown), so a run of consecutive failures cannot be rebuilt from them"

// ocrRoute is the route of the paid endpoint in events.
const ocrRoute = "/v1/ocr"

// Limits are the limits a replay applies: one config's layer 1, daily
// lines and invite rate limit. Modes are ignored: a replay reports what
// each layer would refuse.
type Limits struct {
	User    limiter.Config   // [limits.user]
	Lines   map[string]int64 // daily line by plan name; 0 or missing: none
	Invites limiter.Config   // [invites] rate, window and burst
	// Routes are the [[routes]] entries' limits, by route name.
	Routes map[string]RouteLimits
}

// RouteLimits are one guarded route's layers 1 and 2: its rate, window
// and burst, and its daily line (0: none), per user id or, with ByIP, per
// client key ("ip:" and the address, an IPv6 client by its /64), as the
// route counts them.
type RouteLimits struct {
	ByIP   bool
	Limits limiter.Config
	Daily  int64
}

// Report is what Run found.
type Report struct {
	From          string        `json:"from"`
	To            string        `json:"to"`
	DroppedEvents int64         `json:"dropped_events"`
	Layers        []LayerReport `json:"layers"`
	// Differences say in words what the candidate refuses that the
	// current config does not, and the reverse.
	Differences []string `json:"differences"`
	// Notes say what the replay could not judge from the recorded events.
	Notes []string `json:"notes"`
}

// LayerReport is one layer under both configs.
type LayerReport struct {
	Layer     string  `json:"layer"`
	Current   Outcome `json:"current"`
	Candidate Outcome `json:"candidate"`
	// Note is NoteNoTraffic on a layer no recorded request reached in
	// the range; "" otherwise.
	Note string `json:"note,omitempty"`
}

// Outcome is what one config's layer did with the replayed requests.
type Outcome struct {
	Requests    int64      `json:"requests"`     // requests that reached the layer
	Refused     int64      `json:"refused"`      // of which it refused
	KeysRefused int64      `json:"keys_refused"` // distinct keys it refused
	Top         []KeyCount `json:"top"`          // the ten keys refused most, most first

	byKey map[string]int64
}

// KeyCount is one key's refusals.
type KeyCount struct {
	Key     string `json:"key"`
	Refused int64  `json:"refused"`
}

// arrival is who sent a request and where, as the replay sees it.
type arrival struct {
	key   string // user id, or client key for invites
	ip    string // client key, on a guarded route
	plan  string
	route string
	// attempt marks an OCR request that would go on to the daily line
	// once past layer 1 (a read from storage does not).
	attempt bool
	// refusedBy is the layer that refused the request when it was
	// recorded, on a row of refusals; "" for a request that went on.
	refusedBy string
}

// unit is n requests of one arrival spread evenly over [start,
// start+span), the i-th at start + span*i/n: a row of refusals counted
// per minute (or per tally window), or one request (n 1, span 0). A
// replay keeps it as one value however large n is, and steps through its
// requests without ever holding them.
type unit struct {
	arrival
	start, span int64 // Unix nanoseconds, nanoseconds
	n           int64
	next        int64  // the index of the first request not yet replayed
	seq         uint64 // the order read, for requests at equal times
}

// at is the time of the i-th request, in Unix nanoseconds.
func (u *unit) at(i int64) int64 {
	if u.span == 0 || i == 0 {
		return u.start
	}
	hi, lo := bits.Mul64(uint64(u.span), uint64(i))
	q, _ := bits.Div64(hi, lo, uint64(u.n)) // span*i/n <= span: no overflow
	return u.start + int64(q)
}

// index is the first i (0 to n) whose request is at or after t.
func (u *unit) index(t int64) int64 {
	d := t - u.start
	switch {
	case d <= 0:
		return 0
	case d >= u.span:
		if u.span == 0 {
			return u.n
		}
		// The last request is at start + span*(n-1)/n < start + span.
		return u.n
	}
	// start + floor(span*i/n) >= t  <=>  span*i >= d*n.
	hi, lo := bits.Mul64(uint64(d), uint64(u.n))
	q, r := bits.Div64(hi, lo, uint64(u.span)) // d < span: q < n
	if r > 0 {
		q++
	}
	return min(int64(q), u.n)
}

// unitOf is the requests an event stands for as the replay sees them,
// and how many events it says were lost; ok is false for an event that
// is no request of its own.
func unitOf(e detect.Event) (u unit, ok bool, dropped int64) {
	spread := func(window time.Duration, a arrival) (unit, bool, int64) {
		return unit{arrival: a, start: e.Time.UnixNano(), span: int64(window), n: e.N()}, true, 0
	}
	one := func(a arrival) (unit, bool, int64) {
		if e.Count > 0 {
			// A row that counts such requests per key and minute, as
			// refusals are: whatever its outcome, its requests are
			// spread over the minute like theirs.
			return spread(detect.RefusalWindow, a)
		}
		return unit{arrival: a, start: e.Time.UnixNano(), n: 1}, true, 0
	}
	switch {
	case e.Outcome == detect.OutcomeDropped && e.Route == "":
		return unit{}, false, e.N()
	case e.Outcome == detect.OutcomeShadowRefused:
		// The request went on: its own event follows.
	case e.Route == detect.RouteInvite:
		a := arrival{key: limiter.ClientKey(e.IP), route: e.Route}
		switch {
		case e.Outcome == detect.OutcomeLayerRefused:
			a.refusedBy = LayerInvites
			return spread(detect.RefusalWindow, a)
		case e.Outcome == detect.OutcomeRefused && e.IP != "":
			return spread(detect.DefaultTallyWindow, a)
		case e.Count == 0 && e.IP != "" && e.Outcome != detect.OutcomeCooldownStarted:
			return one(a)
		}
	case strings.HasPrefix(e.Route, detect.RoutePrefix):
		a := arrival{key: e.UserID, ip: limiter.ClientKey(e.IP), route: e.Route}
		switch e.Outcome {
		case detect.OutcomeLayerRefused:
			if e.Layer == LayerRate {
				a.refusedBy = LayerRate
			}
			return spread(detect.RefusalWindow, a)
		case detect.OutcomeCooldownStarted:
			// Not a request of its own.
		default:
			return one(a)
		}
	case e.Route == ocrRoute && e.UserID != "":
		a := arrival{key: e.UserID, plan: e.Plan, route: e.Route}
		switch e.Outcome {
		case detect.OutcomeLayerRefused:
			// Refused at layer 1 or 2, it would have gone on to the
			// line; refused later, it had passed the line's look and
			// took nothing.
			if e.Layer == LayerRate || e.Layer == LayerDaily {
				a.attempt, a.refusedBy = true, e.Layer
			}
			return spread(detect.RefusalWindow, a)
		case detect.OutcomeCached, detect.OutcomeReplayed:
			return one(a)
		default:
			a.attempt = true
			return one(a)
		}
	}
	return unit{}, false, 0
}

// schedule hands out the requests of the units pushed in time order (at
// equal times, in the order pushed), without holding more than the units
// whose requests are not all handed out yet.
type schedule struct {
	h   unitHeap
	seq uint64
}

func (s *schedule) push(u unit) {
	u.seq = s.seq
	s.seq++
	heap.Push(&s.h, &u)
}

// run hands step each request at or before until, in time order: step
// replays the request at u.next, at time at, and returns how many of u's
// requests it decided (1, or more that share a refusal).
func (s *schedule) run(until int64, step func(u *unit, at int64) int64) {
	for len(s.h) > 0 {
		u := s.h[0]
		at := u.at(u.next)
		if at > until {
			return
		}
		u.next += max(1, step(u, at))
		if u.next >= u.n {
			heap.Pop(&s.h)
		} else {
			heap.Fix(&s.h, 0)
		}
	}
}

type unitHeap []*unit

func (h unitHeap) Len() int { return len(h) }
func (h unitHeap) Less(i, j int) bool {
	a, b := h[i].at(h[i].next), h[j].at(h[j].next)
	return a < b || a == b && h[i].seq < h[j].seq
}
func (h unitHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *unitHeap) Push(x any)   { *h = append(*h, x.(*unit)) }
func (h *unitHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return u
}

// sim replays requests through one config's limits on a simulated clock,
// with the real limiter and counter types.
type sim struct {
	l     Limits
	loc   *time.Location
	rate  *limiter.Limiter
	inv   *limiter.Limiter
	stand map[string]bool // layers whose recorded refusals stand (see stands)
	// guarded are the routes' layers, by "route:NAME".
	guarded  map[string]*routeState
	attempts *budget.Attempts
	// lineUntil is, per user past their daily line, when its refusal
	// ends: until then the OCR route's deny cache refuses the user's
	// requests from memory, before layer 1, and so does the replay.
	lineUntil map[string]int64
	out       map[string]*Outcome
	sched     schedule
}

type routeState struct {
	RouteLimits
	windows  *limiter.Limiter
	attempts *budget.Attempts
}

// sameLimits reports whether a and b decide alike (modes aside).
func sameLimits(a, b limiter.Config) bool {
	a, b = a.WithDefaults(), b.WithDefaults()
	a.Mode, b.Mode = "", ""
	return a == b
}

// stands lists the first layers of each pipeline whose limits in l are
// those of the current config: a request such a layer refused when it
// was recorded is refused again by it, whenever in its minute it came,
// and reaches no later layer. Under other limits the replay judges it
// at its time spread over the minute (an estimate).
func stands(l, current Limits) map[string]bool {
	out := map[string]bool{}
	out[LayerRate] = sameLimits(l.User, current.User)
	out[LayerInvites] = sameLimits(l.Invites, current.Invites)
	for name, rl := range l.Routes {
		cr, ok := current.Routes[name]
		out[RouteLayer(name)] = ok && cr.ByIP == rl.ByIP && sameLimits(cr.Limits, rl.Limits)
	}
	return out
}

func newSim(l, current Limits, layers []string, loc *time.Location) (*sim, error) {
	rate, err := limiter.New(l.User)
	if err != nil {
		return nil, fmt.Errorf("limits.user: %w", err)
	}
	inv, err := limiter.New(l.Invites)
	if err != nil {
		return nil, fmt.Errorf("invites: %w", err)
	}
	s := &sim{l: l, loc: loc, rate: rate, inv: inv, stand: stands(l, current), guarded: make(map[string]*routeState, len(l.Routes)), lineUntil: map[string]int64{}, out: map[string]*Outcome{}}
	for name, rl := range l.Routes {
		w, err := limiter.New(rl.Limits)
		if err != nil {
			return nil, fmt.Errorf("routes %q: %w", name, err)
		}
		s.guarded[RouteLayer(name)] = &routeState{RouteLimits: rl, windows: w}
	}
	for _, layer := range layers {
		s.out[layer] = &Outcome{byKey: map[string]int64{}}
	}
	return s, nil
}

// note counts n requests of key at layer, refused or not.
func (s *sim) note(layer, key string, n int64, refused bool) {
	o := s.out[layer]
	o.Requests += n
	if refused {
		o.Refused += n
		o.byKey[key] += n
	}
}

// add takes the requests of u: a row of refusals that stands (see
// stands) is counted at once, the rest are scheduled.
func (s *sim) add(u unit) {
	s.sched.run(u.start-1, s.step)
	switch {
	case u.refusedBy == LayerRate && u.route == ocrRoute && s.stand[LayerRate]:
		s.note(LayerRate, u.key, u.n, true)
		return
	case u.refusedBy == LayerInvites && s.stand[LayerInvites]:
		s.note(LayerInvites, u.key, u.n, true)
		return
	case u.refusedBy == LayerRate && strings.HasPrefix(u.route, detect.RoutePrefix) && s.stand[u.route]:
		if rt := s.guarded[u.route]; rt != nil {
			key := u.key
			if rt.ByIP {
				key = "ip:" + u.ip
			}
			if key != "" && key != "ip:" {
				s.note(u.route, key, u.n, true)
			}
		}
		return
	}
	s.sched.push(u)
}

// finish replays what is still scheduled and sums up.
func (s *sim) finish() map[string]*Outcome {
	s.sched.run(math.MaxInt64, s.step)
	for _, o := range s.out {
		o.KeysRefused = int64(len(o.byKey))
		o.Top = top(o.byKey, 10)
	}
	return s.out
}

// refusedUntil is how many of u's requests from u.next on come before
// the instant a refusal at at with err's retry-after ends: none of them
// can be admitted, as nothing is admitted for the key meanwhile.
func refusedUntil(u *unit, at int64, err error) int64 {
	var r *limiter.Refusal
	if !errors.As(err, &r) {
		return 1
	}
	return max(1, u.index(at+int64(r.RetryAfter))-u.next)
}

// step replays u's request at u.next, at time at.
func (s *sim) step(u *unit, atNS int64) int64 {
	at := time.Unix(0, atNS)
	if s.attempts == nil {
		s.attempts = budget.NewAttempts(s.loc, budget.DayKey(at, s.loc), nil)
	}
	if u.route == detect.RouteInvite {
		err := s.inv.Allow("ip:"+u.key, at)
		n := refusedUntil(u, atNS, err)
		s.note(LayerInvites, u.key, n, err != nil)
		return n
	}
	if strings.HasPrefix(u.route, detect.RoutePrefix) {
		// As the route admits: the rate and burst, then the daily
		// line, taken once admitted. A route this config lacks sees
		// nothing.
		rt := s.guarded[u.route]
		if rt == nil {
			return u.n - u.next
		}
		key := u.key
		if rt.ByIP {
			key = "ip:" + u.ip
		}
		if key == "" || key == "ip:" {
			return u.n - u.next
		}
		if rt.attempts == nil {
			rt.attempts = budget.NewAttempts(s.loc, budget.DayKey(at, s.loc), nil)
		}
		if err := rt.windows.Allow(key, at); err != nil {
			n := refusedUntil(u, atNS, err)
			s.note(u.route, key, n, true)
			return n
		}
		s.note(u.route, key, 1, rt.attempts.Take(key, rt.Daily, at) != nil)
		return 1
	}
	if until, ok := s.lineUntil[u.key]; ok && u.attempt {
		if atNS < until {
			n := max(1, u.index(until)-u.next)
			s.note(LayerDaily, u.key, n, true)
			return n
		}
		delete(s.lineUntil, u.key)
	}
	if err := s.rate.Allow(u.key, at); err != nil {
		n := refusedUntil(u, atNS, err)
		s.note(LayerRate, u.key, n, true)
		return n
	}
	s.note(LayerRate, u.key, 1, false)
	if u.attempt {
		err := s.attempts.Take(u.key, s.l.Lines[u.plan], at)
		var line *budget.LineError
		if errors.As(err, &line) {
			s.lineUntil[u.key] = atNS + int64(line.RetryAfter)
		}
		s.note(LayerDaily, u.key, 1, err != nil)
	}
	return 1
}

// top is the n keys with the most refusals, most first, ties by key.
func top(byKey map[string]int64, n int) []KeyCount {
	out := make([]KeyCount, 0, len(byKey))
	for k, c := range byKey {
		out = append(out, KeyCount{Key: k, Refused: c})
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		if c := cmp.Compare(b.Refused, a.Refused); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out[:min(n, len(out))]
}

// Replayer replays recorded events, added one at a time in time order,
// through the current and the candidate limits. Its memory is that of
// the rows whose requests are still being replayed (a minute's refusal
// rows, a tally window's) and of the keys the limits hold, however many
// requests a row counts.
type Replayer struct {
	cur, cand *sim
	layers    []string
	dropped   int64
	// recorded counts the requests recorded per layer, whatever either
	// config does with them, for the note on a layer with none.
	recorded map[string]int64
}

// NewReplayer is a replay of current against candidate, days in loc.
func NewReplayer(current, candidate Limits, loc *time.Location) (*Replayer, error) {
	layers := []string{LayerRate, LayerDaily, LayerInvites}
	var routeLayers []string
	for name := range union(current.Routes, candidate.Routes) {
		routeLayers = append(routeLayers, RouteLayer(name))
	}
	slices.Sort(routeLayers)
	layers = append(layers, routeLayers...)
	cur, err := newSim(current, current, layers, loc)
	if err != nil {
		return nil, fmt.Errorf("current config: %w", err)
	}
	cand, err := newSim(candidate, current, layers, loc)
	if err != nil {
		return nil, fmt.Errorf("candidate: %w", err)
	}
	return &Replayer{cur: cur, cand: cand, layers: layers, recorded: map[string]int64{}}, nil
}

// Add replays e; events come in time order.
func (r *Replayer) Add(e detect.Event) {
	u, ok, dropped := unitOf(e)
	r.dropped += dropped
	if !ok {
		return
	}
	switch {
	case u.route == detect.RouteInvite:
		r.recorded[LayerInvites] += u.n
	case strings.HasPrefix(u.route, detect.RoutePrefix):
		r.recorded[u.route] += u.n
	default:
		r.recorded[LayerRate] += u.n
		if u.attempt {
			r.recorded[LayerDaily] += u.n
		}
	}
	r.cur.add(u)
	r.cand.add(u)
}

// NoteNoTraffic is the note on a layer no recorded request reached in
// the range: its figures say nothing about either config.
const NoteNoTraffic = "no recorded traffic in the range: nothing to replay"

// Report finishes the replay of the days from to to.
func (r *Replayer) Report(from, to string) Report {
	cur, cand := r.cur.finish(), r.cand.finish()
	rep := Report{From: from, To: to, DroppedEvents: r.dropped, Differences: []string{}, Notes: []string{NoteInviteFails}}
	for _, layer := range r.layers {
		c, d := cur[layer], cand[layer]
		l := LayerReport{Layer: layer, Current: *c, Candidate: *d}
		if r.recorded[layer] == 0 {
			l.Note = NoteNoTraffic
			rep.Notes = append(rep.Notes, layer+": "+NoteNoTraffic)
		}
		rep.Layers = append(rep.Layers, l)
		rep.Differences = append(rep.Differences, differences(layer, c.byKey, d.byKey)...)
	}
	if len(rep.Differences) == 0 {
		rep.Differences = append(rep.Differences, "the candidate would have refused exactly what the current config refuses")
	}
	return rep
}

// Run replays events (those of the days from to to, in loc, in any
// order) through the current and the candidate limits and compares what
// each refuses.
func Run(events []detect.Event, current, candidate Limits, from, to string, loc *time.Location) (Report, error) {
	r, err := NewReplayer(current, candidate, loc)
	if err != nil {
		return Report{}, err
	}
	for _, e := range inTimeOrder(events) {
		r.Add(e)
	}
	return r.Report(from, to), nil
}

// inTimeOrder is events sorted by time, equal times in the order given.
func inTimeOrder(events []detect.Event) []detect.Event {
	sorted := slices.Clone(events)
	slices.SortStableFunc(sorted, func(a, b detect.Event) int { return a.Time.Compare(b.Time) })
	return sorted
}

// differences says which keys the candidate refuses more, and fewer, than
// the current config at layer.
func differences(layer string, cur, cand map[string]int64) []string {
	more, fewer := map[string]int64{}, map[string]int64{}
	for _, k := range slices.Sorted(maps.Keys(union(cur, cand))) {
		switch d := cand[k] - cur[k]; {
		case d > 0:
			more[k] = d
		case d < 0:
			fewer[k] = -d
		}
	}
	var out []string
	say := func(what string, by map[string]int64) {
		if len(by) == 0 {
			return
		}
		var n int64
		for _, c := range by {
			n += c
		}
		var names []string
		for _, kc := range top(by, 10) {
			names = append(names, fmt.Sprintf("%s %d", kc.Key, kc.Refused))
		}
		if len(by) > 10 {
			names = append(names, fmt.Sprintf("and %d more", len(by)-10))
		}
		out = append(out, fmt.Sprintf("%s: the candidate would have refused %d %s requests from %d %s: %s",
			layer, n, what, len(by), plural(len(by), "key", "keys"), strings.Join(names, ", ")))
	}
	say("more", more)
	say("fewer", fewer)
	return out
}

func union[V any](a, b map[string]V) map[string]V {
	out := make(map[string]V, len(a)+len(b))
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
