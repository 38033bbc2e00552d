package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/detect"
)

var _ detect.Store = (*DB)(nil)

// Detection state (layer 4): one aggregate per day, the findings of each
// day's run, the record of the runs, and per day the runs that started and
// never finished. None of it is money: plain transactions.

// checkDay refuses a day that is not "2006-01-02".
func checkDay(day string) error {
	if t, err := time.Parse(time.DateOnly, day); err != nil || t.Format(time.DateOnly) != day {
		return fmt.Errorf("%w: day %q is not YYYY-MM-DD", ErrInvalid, day)
	}
	return nil
}

// StartDetectRun records that a run of day starts and returns how many
// earlier runs of it started and never finished. SaveDetection,
// SaveDetectRun and EndDetectRun clear the count; a crash leaves it.
func (db *DB) StartDetectRun(day string) (unfinished int, err error) {
	if err := checkDay(day); err != nil {
		return 0, fmt.Errorf("start detection run: %w", err)
	}
	ctx, cancel := opContext()
	defer cancel()
	err = db.pool.QueryRow(ctx, `INSERT INTO detect_unfinished (day, runs) VALUES ($1, 1)
		ON CONFLICT (day) DO UPDATE SET runs = detect_unfinished.runs + 1 RETURNING runs - 1`, day).Scan(&unfinished)
	if err != nil {
		return 0, fmt.Errorf("start detection run %s: %w", day, err)
	}
	return unfinished, nil
}

// EndDetectRun clears day's count of unfinished runs: for a run that
// returned an error, which is no crash.
func (db *DB) EndDetectRun(day string) error {
	ctx, cancel := opContext()
	defer cancel()
	if _, err := db.pool.Exec(ctx, `DELETE FROM detect_unfinished WHERE day = $1`, day); err != nil {
		return fmt.Errorf("end detection run %s: %w", day, err)
	}
	return nil
}

// saveRun writes, in one transaction, day's run record, its findings
// (replacing those stored) and, when stats is not nil, its aggregate, and
// clears day's count of unfinished runs.
func (db *DB) saveRun(day string, stats *detect.DayStats, findings []detect.Finding, run detect.RunRecord) error {
	runJSON, err := json.Marshal(run)
	if err != nil {
		return err
	}
	ctx, cancel := opContext()
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM detect_unfinished WHERE day = $1`, day)
	b.Queue(`DELETE FROM findings WHERE day = $1`, day)
	for i, f := range findings {
		fj, err := json.Marshal(f)
		if err != nil {
			return err
		}
		b.Queue(`INSERT INTO findings (day, seq, finding) VALUES ($1, $2, $3)`, day, i, fj)
	}
	if stats != nil {
		sj, err := json.Marshal(stats)
		if err != nil {
			return err
		}
		b.Queue(`INSERT INTO day_stats (day, stats) VALUES ($1, $2) ON CONFLICT (day) DO UPDATE SET stats = excluded.stats`, day, sj)
	}
	b.Queue(`INSERT INTO detect_runs (day, run) VALUES ($1, $2) ON CONFLICT (day) DO UPDATE SET run = excluded.run`, day, runJSON)
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
}

// SaveDetectRun stores a run record and its findings without an aggregate
// (a day given up), and clears the day's count of unfinished runs.
func (db *DB) SaveDetectRun(run detect.RunRecord, findings []detect.Finding) error {
	if err := checkDay(run.Day); err != nil {
		return fmt.Errorf("save detection run: %w", err)
	}
	if err := db.saveRun(run.Day, nil, findings, run); err != nil {
		return fmt.Errorf("save detection run %s: %w", run.Day, err)
	}
	return nil
}

// SaveDetection stores one day's aggregate, findings and run record in one
// transaction, and clears the day's count of unfinished runs. A day run
// again replaces what an earlier run stored for it.
func (db *DB) SaveDetection(stats detect.DayStats, findings []detect.Finding, run detect.RunRecord) error {
	if err := checkDay(stats.Day); err != nil {
		return fmt.Errorf("save detection: %w", err)
	}
	if err := db.saveRun(stats.Day, &stats, findings, run); err != nil {
		return fmt.Errorf("save detection %s: %w", stats.Day, err)
	}
	return nil
}

// jsonRows runs query and decodes its one JSON column per row into a T.
func jsonRows[T any](ctx context.Context, db *DB, query string, args ...any) ([]T, error) {
	rows, err := db.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) {
		var v T
		var raw []byte
		if err := r.Scan(&raw); err != nil {
			return v, err
		}
		return v, json.Unmarshal(raw, &v)
	})
}

// lastDay stands for an empty "to" of a range of days.
const lastDay = "9999-12-31"

// DayStats returns the stored aggregates of the days from..to inclusive,
// in day order; an empty to means up to the last. Days never aggregated
// are missing.
func (db *DB) DayStats(from, to string) ([]detect.DayStats, error) {
	if to == "" {
		to = lastDay
	}
	ctx, cancel := opContext()
	defer cancel()
	out, err := jsonRows[detect.DayStats](ctx, db, `SELECT stats FROM day_stats WHERE day >= $1 AND day <= $2 ORDER BY day`, from, to)
	if err != nil {
		return nil, fmt.Errorf("day stats: %w", err)
	}
	return out, nil
}

// Findings returns the findings of the days from..to inclusive, in day
// order and, within a day, in the order they were stored; an empty to
// means up to the last.
func (db *DB) Findings(from, to string) ([]detect.Finding, error) {
	if to == "" {
		to = lastDay
	}
	ctx, cancel := opContext()
	defer cancel()
	out, err := jsonRows[detect.Finding](ctx, db, `SELECT finding FROM findings WHERE day >= $1 AND day <= $2 ORDER BY day, seq`, from, to)
	if err != nil {
		return nil, fmt.Errorf("findings: %w", err)
	}
	return out, nil
}

// LastDetectRun returns the run of the latest day detection has run for,
// or an error wrapping detect.ErrNoRun when it never ran.
func (db *DB) LastDetectRun() (detect.RunRecord, error) {
	ctx, cancel := opContext()
	defer cancel()
	runs, err := jsonRows[detect.RunRecord](ctx, db, `SELECT run FROM detect_runs ORDER BY day DESC LIMIT 1`)
	switch {
	case err != nil:
		return detect.RunRecord{}, fmt.Errorf("last detection run: %w", err)
	case len(runs) == 0:
		return detect.RunRecord{}, fmt.Errorf("last detection run: %w", detect.ErrNoRun)
	}
	return runs[0], nil
}
