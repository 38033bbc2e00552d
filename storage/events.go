package storage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"go.etcd.io/bbolt"
)

// Event is one statistics event (layer 4), kept apart from billing: it
// records an attempt whatever its outcome, for detection and dashboards.
type Event struct {
	Time         time.Time // when the request finished; required
	UserID       string    // the user; on invite checks, the normalised e-mail submitted
	KeyID        string
	Plan         string `json:",omitempty"` // the plan of the request; empty on invite checks and in older events
	IP           string // client IP as resolved by server
	Route        string
	Outcome      string
	Status       int   // HTTP status returned
	Bytes        int64 // request body bytes
	LatencyMS    int64 // total latency, in milliseconds
	PromptTokens int
	OutputTokens int
	CostMicroUSD int64 // upstream cost, in millionths of a US dollar
	// Count is how many occurrences the event stands for: a row that
	// sums several (invite refusals counted in memory) carries their
	// number; 0, as on every single event and in older rows, means one.
	Count int64 `json:",omitempty"`
}

// N is how many occurrences e stands for: Count, or 1 when it is unset.
func (e Event) N() int64 {
	if e.Count > 0 {
		return e.Count
	}
	return 1
}

// AppendEvents writes events in one plain transaction (not group commit; the
// caller batches). Each event gets its own key, so events with equal times
// never overwrite each other and are read back in the order written. If
// one event is invalid, none is written.
func (db *DB) AppendEvents(events []Event) error {
	if len(events) == 0 {
		return nil
	}
	for i, e := range events {
		if err := checkKeyTime(e.Time); err != nil {
			return fmt.Errorf("append events: event %d: %w", i, err)
		}
	}
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		for _, e := range events {
			seq, err := b.NextSequence()
			if err != nil {
				return fmt.Errorf("event sequence: %w", err)
			}
			if err := putJSON(b, timeKey(e.Time, seq), e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(events), err)
	}
	return nil
}

// eventPage is how many events EachEvent decodes per read transaction.
const eventPage = 1024

// EachEvent calls fn with each statistics event with from <= Time < to,
// in time order (equal times in the order written); a zero from means
// from the first event, a zero to up to the last. It decodes a page of
// events at a time, each page in its own short read transaction, and
// calls fn outside any transaction: a day of a million events needs the
// memory of one page, and no long read blocks the writers (bbolt cannot
// grow its file while a read is open). Events appended during the scan
// after the page read last may be seen. An error from fn stops the scan
// and is returned as it is.
func (db *DB) EachEvent(from, to time.Time, fn func(Event) error) error {
	lo, hi := rangeKeys(from, to)
	page := make([]Event, 0, eventPage)
	var last []byte // key of the last event handed out
	for {
		page = page[:0]
		err := db.view(func(tx *bbolt.Tx) error {
			c := tx.Bucket(bucketEvents).Cursor()
			k, v := c.Seek(lo)
			if last != nil && bytes.Equal(k, last) {
				k, v = c.Next()
			}
			for ; k != nil && len(page) < eventPage; k, v = c.Next() {
				if hi != nil && bytes.Compare(k, hi) >= 0 {
					break
				}
				var e Event
				if err := json.Unmarshal(v, &e); err != nil {
					return fmt.Errorf("event %x: %w", k, err)
				}
				page = append(page, e)
				last = append(last[:0], k...)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("events: %w", err)
		}
		for _, e := range page {
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(page) < eventPage {
			return nil
		}
		lo = bytes.Clone(last)
	}
}

// Events returns the statistics events with from <= Time < to, in time
// order (equal times in the order written), all at once: for small
// ranges; a day's run streams them with EachEvent. A zero from means from
// the first event; a zero to means up to the last.
func (db *DB) Events(from, to time.Time) ([]Event, error) {
	var events []Event
	err := db.EachEvent(from, to, func(e Event) error {
		events = append(events, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return events, nil
}
