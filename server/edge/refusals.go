package edge

import (
	"encoding/binary"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Every refusal the public listener answers is counted once, in
// breakwater_refusals_total{layer,reason} and in the dashboard's counts of
// today, by the error handler as the answer goes out (CountRefusal). The
// layer and reason come with the problem: the guard's refusals carry the
// guard's (Problem.Refusal), the problems declared RefusedIn a layer carry
// that layer and their code, and any other 4xx is layer "input". Not
// refusals: a route that does not exist (404, 405), a client gone (499)
// and the service's own failures (5xx other than the layers' and the
// transport's refusals).

// Layers of the refusals answered by the HTTP edge itself; the guard's
// are its own (guard.LayerRate and so on).
const (
	LayerAuth      = "auth"      // 401 and 403: no identity, banned, no plan
	LayerInput     = "input"     // the request itself: too large, wrong type, undecodable, bad body
	LayerInvites   = "invites"   // POST /v1/invites/verify: the code refused, the IP rate limit
	LayerTransport = "transport" // the transport's bounds: in flight, body memory, upload rate, connections
)

// RefusedIn returns a copy of p counted as a refusal of layer, its code
// the reason.
func (p *Problem) RefusedIn(layer string) *Problem {
	c := *p
	c.layer, c.reason = layer, p.Code
	return &c
}

// CountedAs returns a copy of p counted as a refusal of layer for reason.
func (p *Problem) CountedAs(layer, reason string) *Problem {
	c := *p
	c.layer, c.reason = layer, reason
	return &c
}

// Refusal returns a copy of p with a Retry-After of seconds, counted as a
// refusal of layer for reason decided at: in at's day, when it is
// answered.
func (p *Problem) Refusal(seconds int, layer, reason string, at time.Time) *Problem {
	c := p.WithRetryAfter(seconds)
	c.layer, c.reason, c.at = layer, reason, at
	return c
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
		return LayerInput, p.Code, true
	}
	return "", "", false
}

// CountRefusal counts an answered problem if it is a refusal; the public
// listener's error handler calls it once per answer.
func (e *Edge) CountRefusal(p *Problem) {
	if layer, reason, ok := refusalLabels(p); ok {
		at := p.at
		if at.IsZero() {
			at = e.now()
		}
		e.RefusedAt(at, layer, reason)
	}
}

// Refused counts one refusal in the metrics and today's counts: one
// answered other than through the error handler.
func (e *Edge) Refused(layer, reason string) { e.RefusedAt(e.now(), layer, reason) }

// RefusedAt is Refused for a refusal decided at now.
func (e *Edge) RefusedAt(now time.Time, layer, reason string) {
	e.metrics.refusalsBy.get([2]string{layer, reason}).Inc()
	e.refusalsToday.add(e.calendar.Day(now), layer, reason)
}

// RefusalCount is one layer and reason's refusals of a day.
type RefusalCount struct {
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

// RefusalsOf lists the refusals counted on day (YYYY-MM-DD in the
// operator's zone) by layer and reason, in that order; none for a day
// other than today.
func (e *Edge) RefusalsOf(day string) []RefusalCount {
	d := &e.refusalsToday
	d.mu.Lock()
	defer d.mu.Unlock()
	if day != d.day {
		return nil
	}
	out := make([]RefusalCount, 0, len(d.counts))
	for k, c := range d.counts {
		out = append(out, RefusalCount{Layer: k[0], Reason: k[1], Count: c.n})
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
func (e *Edge) DirtyRefusals() (day string, counts map[string][]byte) {
	d := &e.refusalsToday
	d.mu.Lock()
	defer d.mu.Unlock()
	d.turn(e.calendar.Day(e.now())) // the day turns even without a refusal
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
func (e *Edge) LoadRefusals(day string, counts map[string][]byte) {
	if day != e.calendar.Day(e.now()) {
		return
	}
	d := &e.refusalsToday
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
