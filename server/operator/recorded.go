package operator

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
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
	EachRecorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error)
}

var (
	_ RecordReader = (*Operator)(nil)
	_ RecordReader = (*AdminClient)(nil)
	_ RecordReader = Stored{}
)

// Recorded is the statistics of a stretch of time held whole: the events
// and the findings.
type Recorded struct {
	Events   []detect.Event   `json:"events"`
	Findings []detect.Finding `json:"findings"`
}

// Records reads the statistics through a RecordReader.
type Records struct{ RecordReader }

// Recorded collects the statistics of [from, to) in memory: for a range
// known to be small, as a test reads one. replay and thresholds stream
// theirs with EachRecorded.
func (r Records) Recorded(ctx context.Context, from, to time.Time) (Recorded, error) {
	out := Recorded{Events: []detect.Event{}}
	findings, err := r.EachRecorded(ctx, from, to, func(e detect.Event) error {
		out.Events = append(out.Events, e)
		return nil
	})
	if err != nil {
		return Recorded{}, err
	}
	out.Findings = findings
	return out, nil
}

// Stored reads the statistics of a database directly; it writes nothing.
type Stored struct {
	Store RecordStore
	Loc   *time.Location // the zone of the findings' days
}

// EachRecorded hands fn the events with from <= Time < to, in time order, and
// returns the findings of the days from holds to the day before to ends.
func (s Stored) EachRecorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
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

// EachRecorded reads the statistics of [from, to).
func (o *Operator) EachRecorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
	return Stored{Store: o.store, Loc: o.loc}.EachRecorded(ctx, from, to, fn)
}

// RecordedContentType is the media type of GET /api/recorded's answer:
// a stream of frames written as the events are read, so that neither
// side holds the range. A frame is a kind byte, the payload's length
// (uvarint) and the payload:
//
//	'e' an event: UserID, KeyID, Plan, IP, Route, Layer, Outcome (each a
//	    uvarint length and the bytes), then Time (Unix nanoseconds),
//	    Status, Bytes, LatencyMS, PromptTokens, OutputTokens,
//	    CostMicroUSD, Count (each a varint)
//	'f' a finding, as JSON
//	'x' an error: the server could not finish; the text says why
//	'z' the end: the events and the findings sent (uvarints)
//
// The events come first, in time order, then the findings, then the
// end: an answer without it was cut short. A binary form, not JSON
// lines: decoding a JSON event took the CLI about 16 µs, so a million
// took longer to decode than to replay.
const RecordedContentType = "application/vnd.breakwater.recorded"

// Kinds of the frames of RecordedContentType.
const (
	frameEvent   = 'e'
	frameFinding = 'f'
	frameError   = 'x'
	frameEnd     = 'z'
)

// maxFrame bounds a frame's payload as read: an event is a few hundred
// bytes, a finding a few kilobytes.
const maxFrame = 1 << 20

// RecordedWriter writes the frames of GET /api/recorded's answer to a
// buffered writer; it counts what it wrote for the end frame. The first
// error of the underlying writer is kept and returned by every later call.
type RecordedWriter struct {
	w        *bufio.Writer
	buf      []byte
	events   uint64
	findings uint64
	err      error
}

// NewRecordedWriter writes frames to w.
func NewRecordedWriter(w *bufio.Writer) *RecordedWriter { return &RecordedWriter{w: w} }

func (r *RecordedWriter) frame(kind byte, payload []byte) error {
	if r.err != nil {
		return r.err
	}
	var head [1 + binary.MaxVarintLen64]byte
	head[0] = kind
	n := binary.PutUvarint(head[1:], uint64(len(payload)))
	if _, r.err = r.w.Write(head[:1+n]); r.err == nil {
		_, r.err = r.w.Write(payload)
	}
	return r.err
}

// Event writes an event frame.
func (r *RecordedWriter) Event(e detect.Event) error {
	b := r.buf[:0]
	for _, s := range [...]string{e.UserID, e.KeyID, e.Plan, e.IP, e.Route, e.Layer, e.Outcome} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, v := range [...]int64{e.Time.UnixNano(), int64(e.Status), e.Bytes, e.LatencyMS, int64(e.PromptTokens), int64(e.OutputTokens), e.CostMicroUSD, e.Count} {
		b = binary.AppendVarint(b, v)
	}
	r.buf = b
	r.events++
	return r.frame(frameEvent, b)
}

// Finding writes a finding frame.
func (r *RecordedWriter) Finding(f detect.Finding) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	r.findings++
	return r.frame(frameFinding, b)
}

// End writes the end frame and flushes.
func (r *RecordedWriter) End() error {
	b := binary.AppendUvarint(nil, r.events)
	b = binary.AppendUvarint(b, r.findings)
	if err := r.frame(frameEnd, b); err != nil {
		return err
	}
	return r.w.Flush()
}

// Fail writes an error frame, in place of the end, and flushes.
func (r *RecordedWriter) Fail(why string) error {
	if err := r.frame(frameError, []byte(why)); err != nil {
		return err
	}
	return r.w.Flush()
}

// Counts are the events and findings written so far.
func (r *RecordedWriter) Counts() (events, findings uint64) { return r.events, r.findings }

// ErrCutShort is the error of an admin API answer that ended before it
// was complete, or that is not what the API sends.
var ErrCutShort = errors.New("operator: the admin API's answer was cut short or malformed")

// EachRecorded reads the running server's statistics of [from, to) as
// the server streams them.
func (a *AdminClient) EachRecorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error) {
	// The answer takes as long as the range is large, so no overall
	// timeout: a server that sends nothing for streamIdle is given up on.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := time.AfterFunc(streamIdle, func() { cancel(fmt.Errorf("%w: nothing came for %s", ErrCutShort, streamIdle)) })
	defer idle.Stop()
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
	findings, err := readRecorded(&stallGuard{r: resp.Body, t: idle, d: streamIdle}, a.base, fn)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return nil, fmt.Errorf("admin API at %s: GET /api/recorded: %w", a.base, cause)
	}
	return findings, err
}

// streamIdle is how long a streamed answer may send nothing before the
// client gives up on it.
const streamIdle = time.Minute

// stallGuard pushes its timer back by d at each read that brings bytes.
type stallGuard struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (g *stallGuard) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 {
		g.t.Reset(g.d)
	}
	return n, err
}

// readRecorded reads the frames of GET /api/recorded from r, handing fn
// each event, and returns the findings once the end frame confirms the
// answer is whole.
func readRecorded(r io.Reader, base string, fn func(detect.Event) error) ([]detect.Finding, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	findings := []detect.Finding{}
	var events uint64
	var payload []byte
	cut := func(why string, err error) error {
		if err != nil {
			why += ": " + err.Error()
		}
		return fmt.Errorf("admin API at %s: GET /api/recorded after %d events: %s: %w", base, events, why, ErrCutShort)
	}
	for {
		kind, err := br.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, cut("the answer ended without its end frame", nil)
			}
			return nil, cut("reading", err)
		}
		n, err := binary.ReadUvarint(br)
		if err == nil && n > maxFrame {
			err = fmt.Errorf("a frame of %d bytes", n)
		}
		if err == nil {
			payload = slices.Grow(payload[:0], int(n))[:n]
			_, err = io.ReadFull(br, payload)
		}
		if err != nil {
			return nil, cut("a frame is not what the API sends", err)
		}
		switch kind {
		case frameEvent:
			e, err := decodeEvent(payload)
			if err != nil {
				return nil, cut("an event is not what the API sends", err)
			}
			events++
			if err := fn(e); err != nil {
				return nil, err
			}
		case frameFinding:
			var f detect.Finding
			if err := json.Unmarshal(payload, &f); err != nil {
				return nil, cut("a finding is not what the API sends", err)
			}
			findings = append(findings, f)
		case frameError:
			return nil, fmt.Errorf("admin API at %s: GET /api/recorded: the server stopped after %d events: %s", base, events, payload)
		case frameEnd:
			ne, k := binary.Uvarint(payload)
			nf, k2 := binary.Uvarint(payload[max(k, 0):])
			if k <= 0 || k2 <= 0 || ne != events || nf != uint64(len(findings)) {
				return nil, cut(fmt.Sprintf("the end frame counts %d events and %d findings, %d and %d came", ne, nf, events, len(findings)), nil)
			}
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				return nil, cut("more follows the end frame", err)
			}
			return findings, nil
		default:
			return nil, cut(fmt.Sprintf("a frame of unknown kind %q", kind), nil)
		}
	}
}

// decodeEvent decodes an event frame's payload.
func decodeEvent(b []byte) (detect.Event, error) {
	var e detect.Event
	var bad bool
	str := func() string {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			bad = true
			return ""
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s
	}
	num := func() int64 {
		v, k := binary.Varint(b)
		if k <= 0 {
			bad = true
			return 0
		}
		b = b[k:]
		return v
	}
	e.UserID, e.KeyID, e.Plan, e.IP, e.Route, e.Layer, e.Outcome = str(), str(), str(), str(), str(), str(), str()
	e.Time = time.Unix(0, num()).UTC()
	e.Status = int(num())
	e.Bytes, e.LatencyMS = num(), num()
	e.PromptTokens, e.OutputTokens = int(num()), int(num())
	e.CostMicroUSD, e.Count = num(), num()
	if bad || len(b) != 0 {
		return detect.Event{}, errors.New("malformed event")
	}
	return e, nil
}
