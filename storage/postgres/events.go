package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/detect"
)

var _ detect.EventWriter = (*DB)(nil)

// eventColumns are the events table's columns as AppendEvents writes them.
var eventColumns = []string{"at", "user_id", "key_id", "plan", "ip", "route", "layer", "outcome",
	"status", "bytes", "latency_ms", "prompt_tokens", "output_tokens", "cost_micro_usd", "count"}

// AppendEvents writes a batch of statistics events with one COPY, in a
// transaction of its own, apart from the usage records' (the Recorder
// batches). Equal times are read back in the order written. If one event
// is invalid (a zero time), none is written.
func (db *DB) AppendEvents(events []detect.Event) error {
	if len(events) == 0 {
		return nil
	}
	for i, e := range events {
		if e.Time.IsZero() {
			return fmt.Errorf("append events: event %d: %w: zero time", i, ErrInvalid)
		}
	}
	ctx, cancel := opContext()
	defer cancel()
	n, err := db.pool.CopyFrom(ctx, pgx.Identifier{"events"}, eventColumns, pgx.CopyFromSlice(len(events), func(i int) ([]any, error) {
		e := events[i]
		return []any{e.Time, e.UserID, e.KeyID, e.Plan, e.IP, e.Route, e.Layer, e.Outcome,
			e.Status, e.Bytes, e.LatencyMS, e.PromptTokens, e.OutputTokens, e.CostMicroUSD, e.Count}, nil
	}))
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(events), err)
	}
	if int(n) != len(events) {
		return fmt.Errorf("append %d events: %d written", len(events), n)
	}
	return nil
}

// eventPage is how many events EachEvent reads per query.
const eventPage = 1024

// farFuture stands for a zero "to": no upper bound.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// EachEvent calls fn with each statistics event with from <= Time < to,
// in time order (equal times in the order written); a zero from means
// from the first event, a zero to up to the last. It reads a page of
// events per query, after the last one handed out, and calls fn outside
// any query: a day of a million events needs the memory of one page. An
// error from fn stops the scan and is returned as it is. Times are kept to
// the microsecond.
func (db *DB) EachEvent(from, to time.Time, fn func(detect.Event) error) error {
	if to.IsZero() {
		to = farFuture
	}
	// Times are kept to the microsecond, truncated: an event before to
	// is before to rounded up to the next microsecond.
	if r := to.Truncate(time.Microsecond); !r.Equal(to) {
		to = r.Add(time.Microsecond)
	}
	lastAt, lastID := from, int64(-1)
	page := make([]detect.Event, 0, eventPage)
	for {
		page = page[:0]
		var err error
		if page, lastAt, lastID, err = db.eventPage(page, lastAt, lastID, to); err != nil {
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
	}
}

// eventPage appends to page the events after (at, id) and before to, and
// returns the last one's position.
func (db *DB) eventPage(page []detect.Event, at time.Time, id int64, to time.Time) ([]detect.Event, time.Time, int64, error) {
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT id, `+strings.Join(eventColumns, ", ")+` FROM events
		WHERE (at, id) > ($1, $2) AND at < $3 ORDER BY at, id LIMIT $4`, at, id, to, eventPage)
	if err != nil {
		return page, at, id, err
	}
	defer rows.Close()
	for rows.Next() {
		var e detect.Event
		if err := rows.Scan(&id, &e.Time, &e.UserID, &e.KeyID, &e.Plan, &e.IP, &e.Route, &e.Layer, &e.Outcome,
			&e.Status, &e.Bytes, &e.LatencyMS, &e.PromptTokens, &e.OutputTokens, &e.CostMicroUSD, &e.Count); err != nil {
			return page, at, id, err
		}
		at, e.Time = e.Time, e.Time.UTC()
		page = append(page, e)
	}
	return page, at, id, rows.Err()
}

// Events returns the statistics events with from <= Time < to, all at
// once: for small ranges.
func (db *DB) Events(from, to time.Time) ([]detect.Event, error) {
	var events []detect.Event
	err := db.EachEvent(from, to, func(e detect.Event) error {
		events = append(events, e)
		return nil
	})
	return events, err
}

// prunePage is how many events PruneEvents deletes per statement.
const prunePage = 10000

// PruneEvents deletes the statistics events older than before and returns
// how many it deleted, a page per statement, so that pruning a day of a
// million events never holds them all in one transaction.
func (db *DB) PruneEvents(before time.Time) (int, error) {
	n := 0
	for {
		ctx, cancel := opContext()
		tag, err := db.pool.Exec(ctx, `DELETE FROM events WHERE id IN
			(SELECT id FROM events WHERE at < $1 ORDER BY at, id LIMIT $2)`, before, prunePage)
		cancel()
		if err != nil {
			return n, fmt.Errorf("prune events before %s: %w", before.Format(time.RFC3339), err)
		}
		n += int(tag.RowsAffected())
		if tag.RowsAffected() < prunePage {
			return n, nil
		}
	}
}

// maxLayerRows bounds what LayerRefusals returns: the layers are a few
// names and the guarded routes', never a client's choice, but a bound
// keeps a scrape's cost fixed whatever the events hold.
const maxLayerRows = 256

// layerRefusalsTimeout bounds LayerRefusals: a scrape that waits longer
// goes without the service's figures rather than hang.
const layerRefusalsTimeout = 3 * time.Second

// LayerRefusals sums, by layer, the refusals (and the shadow mode's
// would-be refusals) recorded by every instance with from <= Time < to:
// the service's refusals, for the dashboard and /metrics. The events
// count refusals per key and minute, so the sum lags by up to the
// Recorder's minute and its write-behind.
func (db *DB) LayerRefusals(from, to time.Time) ([]detect.LayerRefusals, error) {
	ctx, cancel := context.WithTimeout(context.Background(), layerRefusalsTimeout)
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT layer, outcome = $3, sum(CASE WHEN count > 0 THEN count ELSE 1 END)::bigint
		FROM events WHERE at >= $1 AND at < $2 AND outcome IN ($3, $4) AND layer <> ''
		GROUP BY 1, 2 ORDER BY 1, 2 LIMIT $5`, from, to, detect.OutcomeShadowRefused, detect.OutcomeLayerRefused, maxLayerRows)
	if err != nil {
		return nil, fmt.Errorf("layer refusals: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (detect.LayerRefusals, error) {
		var l detect.LayerRefusals
		return l, r.Scan(&l.Layer, &l.Shadow, &l.Count)
	})
	if err != nil {
		return nil, fmt.Errorf("layer refusals: %w", err)
	}
	return out, nil
}
