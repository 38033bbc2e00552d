package operator

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"breakwater/detect"
)

// Recorded is what the statistics hold for a stretch of time, for a
// replay or the threshold figures: the events (refusals before the call
// in their per-minute rows) and the detectors' findings.
type Recorded struct {
	Events   []detect.Event   `json:"events"`
	Findings []detect.Finding `json:"findings"`
}

// RecordStore is what reading the statistics needs from storage;
// storage.DB implements it, read only included.
type RecordStore interface {
	EachEvent(from, to time.Time, fn func(detect.Event) error) error
	Findings(from, to string) ([]detect.Finding, error)
}

// RecordReader reads the statistics: the Operator, the AdminClient, and
// Stored on a database opened read only.
type RecordReader interface {
	Recorded(ctx context.Context, from, to time.Time) (Recorded, error)
}

var (
	_ RecordReader = (*Operator)(nil)
	_ RecordReader = (*AdminClient)(nil)
	_ RecordReader = Stored{}
)

// Stored reads the statistics of a database directly; it writes nothing.
type Stored struct {
	Store RecordStore
	Loc   *time.Location // the zone of the findings' days
}

// Recorded returns the events with from <= Time < to, in time order, and
// the findings of the days from holds to the day before to ends.
func (s Stored) Recorded(_ context.Context, from, to time.Time) (Recorded, error) {
	var r Recorded
	err := s.Store.EachEvent(from, to, func(e detect.Event) error {
		r.Events = append(r.Events, e)
		return nil
	})
	if err != nil {
		return Recorded{}, err
	}
	if r.Findings, err = s.Store.Findings(from.In(s.Loc).Format("2006-01-02"), to.Add(-time.Nanosecond).In(s.Loc).Format("2006-01-02")); err != nil {
		return Recorded{}, fmt.Errorf("findings: %w", err)
	}
	if r.Events == nil {
		r.Events = []detect.Event{}
	}
	if r.Findings == nil {
		r.Findings = []detect.Finding{}
	}
	return r, nil
}

// Recorded reads the statistics of [from, to).
func (o *Operator) Recorded(ctx context.Context, from, to time.Time) (Recorded, error) {
	return Stored{Store: o.store, Loc: o.loc}.Recorded(ctx, from, to)
}

// Recorded reads the running server's statistics of [from, to).
func (a *AdminClient) Recorded(ctx context.Context, from, to time.Time) (Recorded, error) {
	var out Recorded
	q := url.Values{"from": {from.UTC().Format(time.RFC3339Nano)}, "to": {to.UTC().Format(time.RFC3339Nano)}}
	err := a.call(ctx, http.MethodGet, "/api/recorded?"+q.Encode(), nil, &out)
	return out, err
}
