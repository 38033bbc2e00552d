package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/detect"
)

// Event rows. Since schema version 5 an event is written in a compact
// binary form, as usage rows are (rows.go); events written before are JSON
// and are still read as they are. After its format byte:
//
//	UserID, KeyID, Plan, IP, Route, Layer, Outcome: uvarint length + bytes each
//	Time (UnixNano), Status, Bytes, LatencyMS, PromptTokens, OutputTokens,
//	CostMicroUSD, Count: varint each
//
// Every request writes an event, and a JSON event was about twice the size
// of its usage row: the binary one is about a quarter of the JSON, so a
// paid read's group commit writes fewer pages, and a day of events takes
// less of the disk.
const eventRowV1 = 0x01

// appendEventRow appends e's binary row to b.
func appendEventRow(b []byte, e detect.Event) []byte {
	b = append(b, eventRowV1)
	for _, s := range [...]string{e.UserID, e.KeyID, e.Plan, e.IP, e.Route, e.Layer, e.Outcome} {
		b = appendText(b, s)
	}
	for _, v := range [...]int64{e.Time.UnixNano(), int64(e.Status), e.Bytes, e.LatencyMS, int64(e.PromptTokens),
		int64(e.OutputTokens), e.CostMicroUSD, e.Count} {
		b = binary.AppendVarint(b, v)
	}
	return b
}

// decodeEventRow decodes an event row of either form.
func decodeEventRow(row []byte) (detect.Event, error) {
	return decodeRow(row, eventRowV1, func(d *rowDecoder, e *detect.Event) {
		e.UserID, e.KeyID, e.Plan, e.IP, e.Route, e.Layer, e.Outcome = d.string(), d.string(), d.string(), d.string(), d.string(), d.string(), d.string()
		e.Time = time.Unix(0, d.varint()).UTC()
		e.Status = d.int()
		e.Bytes, e.LatencyMS = d.varint(), d.varint()
		e.PromptTokens, e.OutputTokens = d.int(), d.int()
		e.CostMicroUSD, e.Count = d.varint(), d.varint()
	})
}

// AppendEvents writes events in one durable write that shares its
// transaction and fsync with concurrent writes (group commit; the caller
// batches). The events are encoded first, so the writer only puts bytes.
// Each event gets its own key, so events with equal times never overwrite
// each other and are read back in the order written. If one event is
// invalid, none is written.
func (db *DB) AppendEvents(events []detect.Event) error {
	if len(events) == 0 {
		return nil
	}
	// One buffer holds every row: one allocation for the batch, not one
	// per event (bbolt keeps the slices until the transaction commits).
	size := 0
	for i, e := range events {
		if err := checkKeyTime(e.Time); err != nil {
			return fmt.Errorf("append events: event %d: %w", i, err)
		}
		size += 1 + 15*binary.MaxVarintLen64 + len(e.UserID) + len(e.KeyID) + len(e.Plan) + len(e.IP) + len(e.Route) + len(e.Layer) + len(e.Outcome)
	}
	buf := make([]byte, 0, size)
	rows := make([][]byte, len(events))
	for i, e := range events {
		start := len(buf)
		buf = appendEventRow(buf, e)
		rows[i] = buf[start:len(buf):len(buf)]
	}
	err := db.commit(context.Background(), func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		b.FillPercent = appendOnlyFill
		for i, e := range events {
			seq, err := b.NextSequence()
			if err != nil {
				return fmt.Errorf("event sequence: %w", err)
			}
			if err := b.Put(timeKey(e.Time, seq), rows[i]); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
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
func (db *DB) EachEvent(from, to time.Time, fn func(detect.Event) error) error {
	lo, hi := rangeKeys(from, to)
	page := make([]detect.Event, 0, eventPage)
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
				e, err := decodeEventRow(v)
				if err != nil {
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
func (db *DB) Events(from, to time.Time) ([]detect.Event, error) {
	var events []detect.Event
	err := db.EachEvent(from, to, func(e detect.Event) error {
		events = append(events, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return events, nil
}
