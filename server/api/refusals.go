package api

import (
	"encoding/binary"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"breakwater/detect"
	"breakwater/server/guard"
)

// Every refusal the public listener answers is counted once, in
// breakwater_refusals_total{layer,reason} and in the dashboard's counts of
// today, by the error handler as the answer goes out (countRefusal). The
// layer and reason come with the problem: the guard's refusals carry the
// guard's (refusal), the problems below carry the layer they were declared
// with and their code, and any other 4xx is layer "input". Not refusals:
// a route that does not exist (404, 405), a client gone (499) and the
// service's own failures (5xx other than the layers' and the transport's
// refusals).

// Layers of the refusals answered by the transport itself; the guard's
// are its own (guard.LayerRate and so on).
const (
	layerAuth      = "auth"      // 401 and 403: no identity, banned, no plan
	layerInput     = "input"     // the request itself: too large, wrong type, undecodable, bad body
	layerInvites   = "invites"   // POST /v1/invites/verify: the code refused, the IP rate limit
	layerTransport = "transport" // the transport's bounds: in flight, body memory, upload rate, connections
)

// knownRefusals are the label sets of breakwater_refusals_total that exist
// from start, at zero, so that an alert rule needs no absent().
var knownRefusals = map[string][]string{
	guard.LayerRate:     {"rate", "burst"},
	guard.LayerAttempts: {"daily_line"},
	guard.LayerQuota:    {"monthly_quota", guard.ReasonUnavailable},
	guard.LayerUsage:    {"records_failing", "ledger_failing"},
	guard.LayerBudget:   {"manual", "daily_requests", "daily_usd", "monthly_usd", "daily_usd_in_flight", "monthly_usd_in_flight"},
	layerAuth:           {errUnauthorized.Code, errBanned.Code, errNoPlan.Code},
	layerTransport: {errTooManyInFlight.Code, errServerBusy.Code, errUploadTooSlow.Code, errTooManyParts.Code,
		"max_connections", "max_header_lines", "max_header_memory"},
	layerInput: {errTooLarge.Code, errBadBody.Code, errMissingImage.Code, errUnsupportedType.Code,
		errUndecodable.Code, errTooManyPixels.Code, errInvalidEmail.Code, "bad_request"},
	layerInvites: {errInviteRefused.Code, errInviteRateLimited.Code},
}

// refusedIn returns a copy of p counted as a refusal of layer, its code
// the reason.
func (p *Problem) refusedIn(layer string) *Problem {
	c := *p
	c.layer, c.reason = layer, p.Code
	return &c
}

// countedAs returns a copy of p counted as a refusal of layer for reason.
func (p *Problem) countedAs(layer, reason string) *Problem {
	c := *p
	c.layer, c.reason = layer, reason
	return &c
}

// routeRefusal is refusal for a guarded route: the problem of the guard's
// refusal, counted under the route's layer ("route:NAME").
func (s *Server) routeRefusal(layer string, r *guard.Refusal) error {
	return refusalProblem(r).countedAs(layer, r.Reason)
}

// refusalLabels says under which layer and reason an answered problem is
// counted, and whether it is a refusal at all.
func refusalLabels(p *Problem) (layer, reason string, ok bool) {
	switch {
	case p.layer != "":
		return p.layer, p.reason, true
	case p.Status == http.StatusNotFound, p.Status == http.StatusMethodNotAllowed:
		return "", "", false // no such route: breakwater_http_requests_total{route="unmatched"}
	case p.Status >= 400 && p.Status < 499:
		return layerInput, p.Code, true
	}
	return "", "", false
}

// countRefusal counts an answered problem if it is a refusal; the public
// listener's error handler calls it once per answer.
func (s *Server) countRefusal(p *Problem) {
	if layer, reason, ok := refusalLabels(p); ok {
		at := p.at
		if at.IsZero() {
			at = s.now()
		}
		s.refusedAt(at, layer, reason)
	}
}

// refused counts one refusal in the metrics and today's counts.
func (s *Server) refused(layer, reason string) { s.refusedAt(s.now(), layer, reason) }

// refusedAt is refused for a refusal decided at now.
func (s *Server) refusedAt(now time.Time, layer, reason string) {
	s.d.Metrics.refusalsBy.get([2]string{layer, reason}).Inc()
	s.refusalsToday.add(s.calendar.Day(now), layer, reason)
}

// refusal turns a refusal by layers 1-3 at now into the problem users
// see, counted under the guard's layer and reason, in now's day, when it
// is answered. The problems carry no figure of any threshold.
func (s *Server) refusal(r *guard.Refusal, now time.Time) error {
	p := refusalProblem(r)
	p.layer, p.reason, p.at = r.Layer, r.Reason, now
	return p
}

// refusalProblem is the problem of a refusal by layers 1-3, a copy with
// its Retry-After.
func refusalProblem(r *guard.Refusal) *Problem {
	retry := ceilSeconds(r.RetryAfter)
	switch {
	case r.Layer == guard.LayerRate:
		return errRateLimited.withRetryAfter(retry)
	case r.Layer == guard.LayerAttempts:
		return errDailyLimit.withRetryAfter(retry)
	case r.Layer == guard.LayerQuota && r.Reason == guard.ReasonUnavailable:
		// The database did not answer: the service's failure, not the
		// user's quota (counted as quota/unavailable).
		return errRecordsUnavailable.withRetryAfter(retry)
	case r.Layer == guard.LayerQuota:
		return errQuotaExceeded.withRetryAfter(retry)
	case r.Layer == guard.LayerUsage:
		return errUsagePaused.withRetryAfter(retry)
	case r.Busy:
		// Only the worst cases of calls in flight block this one: the
		// brake is not engaged, and a retry in seconds may fit.
		return errBudgetBusy.withRetryAfter(retry)
	case r.Reason == "manual":
		return errPausedByOperator.withRetryAfter(retry)
	case r.Reason == "daily_requests":
		return errRequestCeiling.withRetryAfter(retry)
	}
	return errBudgetPaused.withRetryAfter(retry)
}

// refusedBy is the guard's hook on each refusal: it raises the brake
// alert when a budget ceiling or the operator's switch holds (for the
// switch, the alert confirms that calls are really refused). The refusal
// is counted when it is answered, not here.
func (s *Server) refusedBy(r *guard.Refusal) {
	if r.Layer == guard.LayerBudget && !r.Busy {
		// The ceiling's value and the count go to the operator only; the
		// refusal answered to the client names no figure.
		// Made once per alert, not on every refusal of a flood.
		reason := r.Reason
		s.alertWith(detect.KindBrakeEngaged, func() (string, map[string]string) {
			now := s.now()
			figures := CountedFigures(s.d.Budget.Counted(now)) // what the brake decided on
			if reason == "manual" {
				figures = Figures(s.d.Budget.Status(now)) // no ceiling: what was made
			}
			return detect.BrakeAlert(reason, figures, now, s.d.Operator.Location())
		})
	}
}

type refusalCount struct {
	Layer, Reason string
	Count         int64
}

// dailyRefusals counts refusals by layer and reason for the current day,
// for the dashboard (the metrics count since start). The write-behind
// copies what changed (dirty) to storage, so a restart keeps the day's
// counts.
type dailyRefusals struct {
	mu     sync.Mutex
	day    string
	counts map[[2]string]*dayCount
	dirty  int // how many counts are dirty
}

// dayCount is one layer and reason's count of the day; dirty until the
// write-behind has taken it.
type dayCount struct {
	n     int64
	dirty bool
}

func (d *dailyRefusals) add(day, layer, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.turn(day)
	k := [2]string{layer, reason}
	c := d.counts[k]
	if c == nil {
		c = &dayCount{}
		d.counts[k] = c
	}
	c.n++
	if !c.dirty {
		c.dirty = true
		d.dirty++
	}
}

// turn starts day's counts if they are not the ones held; d.mu is held.
func (d *dailyRefusals) turn(day string) {
	if day != d.day || d.counts == nil {
		d.day, d.counts, d.dirty = day, map[[2]string]*dayCount{}, 0
	}
}

func (d *dailyRefusals) list(day string) []refusalCount {
	d.mu.Lock()
	defer d.mu.Unlock()
	if day != d.day {
		return nil
	}
	out := make([]refusalCount, 0, len(d.counts))
	for k, c := range d.counts {
		out = append(out, refusalCount{Layer: k[0], Reason: k[1], Count: c.n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Layer != out[j].Layer {
			return out[i].Layer < out[j].Layer
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// refusalKey is a stored count's key: layer and reason, which hold no
// space.
func refusalKey(k [2]string) string { return k[0] + " " + k[1] }

// DirtyRefusals returns the day of today's refusal counts and those that
// changed since its last call, for the write-behind: keyed "layer reason",
// each count as 8 bytes big-endian, to be written over the stored ones.
func (s *Server) DirtyRefusals() (day string, counts map[string][]byte) {
	d := &s.refusalsToday
	d.mu.Lock()
	defer d.mu.Unlock()
	d.turn(s.calendar.Day(s.now())) // the day turns even without a refusal
	if d.dirty == 0 {
		return d.day, nil
	}
	counts = make(map[string][]byte, d.dirty)
	for k, c := range d.counts {
		if c.dirty {
			counts[refusalKey(k)] = binary.BigEndian.AppendUint64(nil, uint64(c.n))
			c.dirty = false
		}
	}
	d.dirty = 0
	return d.day, counts
}

// LoadRefusals restores the refusal counts of day that DirtyRefusals gave
// before a restart, before the server answers anything; counts of a day
// other than today, and entries it cannot read, are left out.
func (s *Server) LoadRefusals(day string, counts map[string][]byte) {
	if day != s.calendar.Day(s.now()) {
		return
	}
	d := &s.refusalsToday
	d.mu.Lock()
	defer d.mu.Unlock()
	d.turn(day)
	for key, v := range counts {
		layer, reason, ok := strings.Cut(key, " ")
		if !ok || len(v) != 8 {
			continue
		}
		k := [2]string{layer, reason}
		c := d.counts[k]
		if c == nil {
			c = &dayCount{}
			d.counts[k] = c
		}
		c.n += int64(binary.BigEndian.Uint64(v)) // stored already: not dirty
	}
}
