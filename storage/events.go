package storage

import (
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

// Events returns the statistics events with from <= Time < to, in time
// order (equal times in the order written). A zero from means from the
// first event; a zero to means up to the last.
func (db *DB) Events(from, to time.Time) ([]Event, error) {
	var events []Event
	err := db.view(func(tx *bbolt.Tx) error {
		return scanRange(tx.Bucket(bucketEvents), from, to, func(k, v []byte) error {
			var e Event
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			events = append(events, e)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	return events, nil
}
