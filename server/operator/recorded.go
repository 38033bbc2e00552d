package operator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"breakwater/detect"
)

// RecordStore is what reading the statistics needs from storage;
// storage.DB implements it, read only included.
type RecordStore interface {
	EachEvent(from, to time.Time, fn func(detect.Event) error) error
	Findings(from, to string) ([]detect.Finding, error)
}

// RecordReader reads the statistics of a stretch of time, for a replay
// or the threshold figures: it hands fn each event (refusals before the
// call in their per-minute rows) in time order, one at a time, and then
// returns the detectors' findings. Nothing holds the events: a range of
// millions reads in the memory of a page. An error from fn stops the
// reading and is returned as it is.
type RecordReader interface {
	Recorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error)
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

// Recorded hands fn the events with from <= Time < to, in time order, and
// returns the findings of the days from holds to the day before to ends.
func (s Stored) Recorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
	err := s.Store.EachEvent(from, to, func(e detect.Event) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fn(e)
	})
	if err != nil {
		return nil, err
	}
	findings, err := s.Store.Findings(from.In(s.Loc).Format("2006-01-02"), to.Add(-time.Nanosecond).In(s.Loc).Format("2006-01-02"))
	if err != nil {
		return nil, fmt.Errorf("findings: %w", err)
	}
	if findings == nil {
		findings = []detect.Finding{}
	}
	return findings, nil
}

// Recorded reads the statistics of [from, to).
func (o *Operator) Recorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
	return Stored{Store: o.store, Loc: o.loc}.Recorded(ctx, from, to, fn)
}

// RecordedContentType is the media type of GET /api/recorded's answer:
// one JSON RecordedLine per line, written as the events are read, so
// that neither side holds the range.
const RecordedContentType = "application/x-ndjson"

// RecordedLine is one line of GET /api/recorded's answer; one field is
// set. The events come first, in time order, then the findings, then
// End, which says how many of each were sent: an answer without it was
// cut short. Error ends an answer the server could not finish.
type RecordedLine struct {
	Event   *detect.Event   `json:"event,omitempty"`
	Finding *detect.Finding `json:"finding,omitempty"`
	End     *RecordedEnd    `json:"end,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// RecordedEnd closes a complete answer of GET /api/recorded.
type RecordedEnd struct {
	Events   int64 `json:"events"`
	Findings int64 `json:"findings"`
}

// ErrCutShort is the error of an admin API answer that ended before it
// was complete, or that is not what the API sends.
var ErrCutShort = errors.New("operator: the admin API's answer was cut short or malformed")

// Recorded reads the running server's statistics of [from, to) as the
// server streams them.
func (a *AdminClient) Recorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
	q := url.Values{"from": {from.UTC().Format(time.RFC3339Nano)}, "to": {to.UTC().Format(time.RFC3339Nano)}}
	req, err := a.newRequest(ctx, http.MethodGet, "/api/recorded?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.streaming().Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, a.failure(resp)
	}
	if ct := resp.Header.Get("Content-Type"); ct != RecordedContentType {
		return nil, fmt.Errorf("admin API at %s: GET /api/recorded answered %q, not %s: is the server another version of breakwater? %w", a.base, ct, RecordedContentType, ErrCutShort)
	}
	return readRecorded(resp.Body, a.base, fn)
}

// readRecorded reads the lines of GET /api/recorded from r, handing fn
// each event, and returns the findings once End confirms the answer is
// whole.
func readRecorded(r io.Reader, base string, fn func(detect.Event) error) ([]detect.Finding, error) {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 64<<10))
	findings := []detect.Finding{}
	var events int64
	cut := func(why string, err error) error {
		if err != nil {
			why += ": " + err.Error()
		}
		return fmt.Errorf("admin API at %s: GET /api/recorded after %d events: %s: %w", base, events, why, ErrCutShort)
	}
	for {
		var line RecordedLine
		if err := dec.Decode(&line); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, cut("the answer ended without its end line", nil)
			}
			return nil, cut("a line is not what the API sends", err)
		}
		switch {
		case line.Event != nil:
			events++
			if err := fn(*line.Event); err != nil {
				return nil, err
			}
		case line.Finding != nil:
			findings = append(findings, *line.Finding)
		case line.Error != "":
			return nil, fmt.Errorf("admin API at %s: GET /api/recorded: the server stopped after %d events: %s", base, events, line.Error)
		case line.End != nil:
			if line.End.Events != events || line.End.Findings != int64(len(findings)) {
				return nil, cut(fmt.Sprintf("the end line counts %d events and %d findings, %d and %d came", line.End.Events, line.End.Findings, events, len(findings)), nil)
			}
			if _, err := dec.Token(); !errors.Is(err, io.EOF) {
				return nil, cut("more follows the end line", err)
			}
			return findings, nil
		default:
			return nil, cut("an empty line", nil)
		}
	}
}
