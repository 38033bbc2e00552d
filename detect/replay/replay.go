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
package replay

import (
	"cmp"
	"fmt"
	"maps"
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

// arrival is one request as the replay sees it.
type arrival struct {
	at    time.Time
	key   string // user id, or client key for invites
	ip    string // client key, on a guarded route
	plan  string
	route string
	// attempt marks an OCR request that would go on to the daily line
	// once past layer 1 (a read from storage does not).
	attempt bool
}

// arrivals turns events into requests in time order, and counts the
// events lost.
func arrivals(events []detect.Event) (out []arrival, dropped int64) {
	spread := func(e detect.Event, window time.Duration, a arrival) {
		n := e.N()
		for i := range n {
			a.at = e.Time.Add(time.Duration(int64(window) * i / n))
			out = append(out, a)
		}
	}
	for _, e := range events {
		switch {
		case e.Outcome == detect.OutcomeDropped && e.Route == "":
			dropped += e.N()
		case e.Outcome == detect.OutcomeShadowRefused:
			// The request went on: its own event follows.
		case e.Route == detect.RouteInvite:
			switch {
			case e.Outcome == detect.OutcomeLayerRefused:
				spread(e, detect.RefusalWindow, arrival{key: limiter.ClientKey(e.IP), route: e.Route})
			case e.Outcome == detect.OutcomeRefused && e.IP != "":
				spread(e, detect.DefaultTallyWindow, arrival{key: limiter.ClientKey(e.IP), route: e.Route})
			case e.Count == 0 && e.IP != "" && e.Outcome != detect.OutcomeCooldownStarted:
				out = append(out, arrival{at: e.Time, key: limiter.ClientKey(e.IP), route: e.Route})
			}
		case strings.HasPrefix(e.Route, detect.RoutePrefix):
			a := arrival{key: e.UserID, ip: limiter.ClientKey(e.IP), route: e.Route}
			switch e.Outcome {
			case detect.OutcomeLayerRefused:
				spread(e, detect.RefusalWindow, a)
			case detect.OutcomeShadowRefused, detect.OutcomeCooldownStarted:
				// Not a request of its own.
			default:
				a.at = e.Time
				out = append(out, a)
			}
		case e.Route == ocrRoute && e.UserID != "":
			a := arrival{key: e.UserID, plan: e.Plan, route: e.Route}
			switch e.Outcome {
			case detect.OutcomeLayerRefused:
				// Refused at layer 1 or 2, it would have gone on to the
				// line; refused later, it had passed the line's look and
				// took nothing.
				a.attempt = e.Layer == LayerRate || e.Layer == LayerDaily
				spread(e, detect.RefusalWindow, a)
			case detect.OutcomeCached, detect.OutcomeReplayed:
				// Counted per minute since they are answered free; one
				// event apiece in older versions.
				spread(e, detect.RefusalWindow, a)
			default:
				a.at, a.attempt = e.Time, true
				out = append(out, a)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b arrival) int { return a.at.Compare(b.at) })
	return out, dropped
}

// simulate runs arrivals through one config's limits on a simulated
// clock, with the real limiter and counter types.
func simulate(in []arrival, l Limits, layers []string, loc *time.Location) (map[string]*Outcome, error) {
	rate, err := limiter.New(l.User)
	if err != nil {
		return nil, fmt.Errorf("limits.user: %w", err)
	}
	inv, err := limiter.New(l.Invites)
	if err != nil {
		return nil, fmt.Errorf("invites: %w", err)
	}
	type routeState struct {
		RouteLimits
		windows  *limiter.Limiter
		attempts *budget.Attempts
	}
	guarded := make(map[string]*routeState, len(l.Routes))
	for name, rl := range l.Routes {
		w, err := limiter.New(rl.Limits)
		if err != nil {
			return nil, fmt.Errorf("routes %q: %w", name, err)
		}
		guarded[RouteLayer(name)] = &routeState{RouteLimits: rl, windows: w}
	}
	out := map[string]*Outcome{}
	for _, layer := range layers {
		out[layer] = &Outcome{byKey: map[string]int64{}}
	}
	note := func(layer, key string, err error) bool {
		o := out[layer]
		o.Requests++
		if err == nil {
			return true
		}
		o.Refused++
		o.byKey[key]++
		return false
	}
	var attempts *budget.Attempts
	for _, a := range in {
		if attempts == nil {
			attempts = budget.NewAttempts(loc, budget.DayKey(a.at, loc), nil)
		}
		if a.route == detect.RouteInvite {
			note(LayerInvites, a.key, inv.Allow("ip:"+a.key, a.at))
			continue
		}
		if strings.HasPrefix(a.route, detect.RoutePrefix) {
			// As the route admits: the rate and burst, then the daily
			// line, taken once admitted. A route this config lacks
			// sees nothing.
			rt := guarded[a.route]
			if rt == nil {
				continue
			}
			key := a.key
			if rt.ByIP {
				key = "ip:" + a.ip
			}
			if key == "" {
				continue
			}
			if rt.attempts == nil {
				rt.attempts = budget.NewAttempts(loc, budget.DayKey(a.at, loc), nil)
			}
			err := rt.windows.Allow(key, a.at)
			if err == nil {
				err = rt.attempts.Take(key, rt.Daily, a.at)
			}
			note(a.route, key, err)
			continue
		}
		if !note(LayerRate, a.key, rate.Allow(a.key, a.at)) || !a.attempt {
			continue
		}
		note(LayerDaily, a.key, attempts.Take(a.key, l.Lines[a.plan], a.at))
	}
	for _, o := range out {
		o.KeysRefused = int64(len(o.byKey))
		o.Top = top(o.byKey, 10)
	}
	return out, nil
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

// Run replays events (those of the days from to to, in loc) through the
// current and the candidate limits and compares what each refuses.
func Run(events []detect.Event, current, candidate Limits, from, to string, loc *time.Location) (Report, error) {
	in, dropped := arrivals(events)
	layers := []string{LayerRate, LayerDaily, LayerInvites}
	var routeLayers []string
	for name := range union(current.Routes, candidate.Routes) {
		routeLayers = append(routeLayers, RouteLayer(name))
	}
	slices.Sort(routeLayers)
	layers = append(layers, routeLayers...)
	cur, err := simulate(in, current, layers, loc)
	if err != nil {
		return Report{}, fmt.Errorf("current config: %w", err)
	}
	cand, err := simulate(in, candidate, layers, loc)
	if err != nil {
		return Report{}, fmt.Errorf("candidate: %w", err)
	}
	rep := Report{From: from, To: to, DroppedEvents: dropped, Differences: []string{}, Notes: []string{NoteInviteFails}}
	for _, layer := range layers {
		c, d := cur[layer], cand[layer]
		rep.Layers = append(rep.Layers, LayerReport{Layer: layer, Current: *c, Candidate: *d})
		rep.Differences = append(rep.Differences, differences(layer, c.byKey, d.byKey)...)
	}
	if len(rep.Differences) == 0 {
		rep.Differences = append(rep.Differences, "the candidate would have refused exactly what the current config refuses")
	}
	return rep, nil
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
