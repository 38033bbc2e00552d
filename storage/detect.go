package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/detect"
)

// Detection state (layer 4): one aggregate per day, the findings of each
// day's run, the record of the runs themselves, and when each alert kind
// was last sent. None of it is money: plain transactions, no group commit.

// StartDetectRun records that a run of day starts and returns how many
// earlier runs of it started and never finished. SaveDetection,
// SaveDetectRun and EndDetectRun clear the count; a crash or a kill
// leaves it.
func (db *DB) StartDetectRun(day string) (unfinished int, err error) {
	if err := checkDay(day); err != nil {
		return 0, fmt.Errorf("start detection run: %w", err)
	}
	err = db.update(func(tx *bbolt.Tx) error {
		// Per day, the runs that started and have not finished: what a
		// run that crashed the process leaves behind.
		b := tx.Bucket(bucketDetectAttempts)
		if v := b.Get([]byte(day)); len(v) == 8 {
			unfinished = int(binary.BigEndian.Uint64(v))
		}
		return b.Put([]byte(day), encodeUint64(uint64(unfinished+1)))
	})
	if err != nil {
		return 0, fmt.Errorf("start detection run %s: %w", day, err)
	}
	return unfinished, nil
}

// EndDetectRun clears day's count of unfinished runs: for a run that
// returned an error, which is no crash.
func (db *DB) EndDetectRun(day string) error {
	if err := db.update(func(tx *bbolt.Tx) error { return clearAttempts(tx, day) }); err != nil {
		return fmt.Errorf("end detection run %s: %w", day, err)
	}
	return nil
}

// SaveDetectRun stores a run record and its findings without an
// aggregate (a day given up), and clears the day's count of unfinished
// runs.
func (db *DB) SaveDetectRun(run detect.RunRecord, findings []detect.Finding) error {
	if err := checkDay(run.Day); err != nil {
		return fmt.Errorf("save detection run: %w", err)
	}
	err := db.update(func(tx *bbolt.Tx) error {
		if err := clearAttempts(tx, run.Day); err != nil {
			return err
		}
		if err := putFindings(tx, run.Day, findings); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketDetectRuns), []byte(run.Day), run)
	})
	if err != nil {
		return fmt.Errorf("save detection run %s: %w", run.Day, err)
	}
	return nil
}

// putFindings replaces day's findings.
func putFindings(tx *bbolt.Tx, day string, findings []detect.Finding) error {
	fb := tx.Bucket(bucketFindings)
	if fb.Bucket([]byte(day)) != nil {
		if err := fb.DeleteBucket([]byte(day)); err != nil {
			return err
		}
	}
	b, err := fb.CreateBucket([]byte(day))
	if err != nil {
		return err
	}
	for i, f := range findings {
		if err := putJSON(b, encodeUint64(uint64(i)), f); err != nil {
			return err
		}
	}
	return nil
}

func clearAttempts(tx *bbolt.Tx, day string) error {
	if b := tx.Bucket(bucketDetectAttempts); b != nil {
		return b.Delete([]byte(day))
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
	err := db.update(func(tx *bbolt.Tx) error {
		day := []byte(stats.Day)
		if err := clearAttempts(tx, stats.Day); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(bucketAggregates), day, stats); err != nil {
			return err
		}
		if err := putFindings(tx, stats.Day, findings); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketDetectRuns), day, run)
	})
	if err != nil {
		return fmt.Errorf("save detection %s: %w", stats.Day, err)
	}
	return nil
}

// DayStats returns the stored aggregates of the days from..to inclusive,
// in day order. Days never aggregated are missing.
func (db *DB) DayStats(from, to string) ([]detect.DayStats, error) {
	var out []detect.DayStats
	err := db.view(func(tx *bbolt.Tx) error {
		return scanDays(tx.Bucket(bucketAggregates), from, to, func(k, v []byte) error {
			var s detect.DayStats
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("aggregate %s: %w", k, err)
			}
			out = append(out, s)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("day stats: %w", err)
	}
	return out, nil
}

// Findings returns the findings of the days from..to inclusive, in day
// order and, within a day, in the order they were stored.
func (db *DB) Findings(from, to string) ([]detect.Finding, error) {
	var out []detect.Finding
	err := db.view(func(tx *bbolt.Tx) error {
		fb := tx.Bucket(bucketFindings)
		var days [][]byte
		_ = fb.ForEachBucket(func(k []byte) error {
			if string(k) >= from && (to == "" || string(k) <= to) {
				days = append(days, append([]byte(nil), k...))
			}
			return nil
		})
		sort.Slice(days, func(i, j int) bool { return bytes.Compare(days[i], days[j]) < 0 })
		for _, day := range days {
			err := fb.Bucket(day).ForEach(func(k, v []byte) error {
				var f detect.Finding
				if err := json.Unmarshal(v, &f); err != nil {
					return fmt.Errorf("finding %s/%x: %w", day, k, err)
				}
				out = append(out, f)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("findings: %w", err)
	}
	return out, nil
}

// LastDetectRun returns the run of the latest day detection has run for,
// or errNoRun when it never ran.
func (db *DB) LastDetectRun() (detect.RunRecord, error) {
	var run detect.RunRecord
	err := db.view(func(tx *bbolt.Tx) error {
		k, v := tx.Bucket(bucketDetectRuns).Cursor().Last()
		if k == nil {
			return errNoRun
		}
		return json.Unmarshal(v, &run)
	})
	if err != nil {
		return detect.RunRecord{}, fmt.Errorf("last detection run: %w", err)
	}
	return run, nil
}

// errNoRun is LastDetectRun's error on a database detection never ran
// on: ErrNotFound to storage's own callers, and detect.ErrNoRun to the
// Runner, which declares it.
var errNoRun = fmt.Errorf("%w (%w)", ErrNotFound, detect.ErrNoRun)

// prunePage is how many events PruneEvents deletes per transaction.
const prunePage = 4096

// PruneEvents deletes the statistics events older than before and returns
// how many it deleted. It deletes a page of events per transaction, so
// pruning a day of a million events never holds them all in one
// transaction's memory.
func (db *DB) PruneEvents(before time.Time) (int, error) {
	_, hi := rangeKeys(time.Time{}, before)
	n := 0
	for {
		deleted := 0
		err := db.update(func(tx *bbolt.Tx) error {
			c := tx.Bucket(bucketEvents).Cursor()
			for k, _ := c.First(); k != nil && (hi == nil || bytes.Compare(k, hi) < 0) && deleted < prunePage; k, _ = c.First() {
				if err := c.Delete(); err != nil {
					return err
				}
				deleted++
			}
			return nil
		})
		if err != nil {
			return n, fmt.Errorf("prune events before %s: %w", before.Format(time.RFC3339), err)
		}
		n += deleted
		if deleted < prunePage {
			return n, nil
		}
	}
}

// SaveAlertState records that an alert of st.Kind was sent at st.SentAt.
func (db *DB) SaveAlertState(st detect.AlertState) error {
	if st.Kind == "" {
		return fmt.Errorf("save alert state: %w: no kind", ErrInvalid)
	}
	err := db.update(func(tx *bbolt.Tx) error {
		return putJSON(tx.Bucket(bucketAlerts), []byte(st.Kind), st)
	})
	if err != nil {
		return fmt.Errorf("save alert state %s: %w", st.Kind, err)
	}
	return nil
}

// AlertStates returns the last sending of every alert kind, by kind.
func (db *DB) AlertStates() ([]detect.AlertState, error) {
	var out []detect.AlertState
	err := db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketAlerts).ForEach(func(k, v []byte) error {
			var st detect.AlertState
			if err := json.Unmarshal(v, &st); err != nil {
				return fmt.Errorf("alert state %s: %w", k, err)
			}
			out = append(out, st)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("alert states: %w", err)
	}
	return out, nil
}

// scanDays calls fn for each key of b from..to inclusive ("2006-01-02"
// keys sort by day); an empty to means up to the last.
func scanDays(b *bbolt.Bucket, from, to string, fn func(k, v []byte) error) error {
	c := b.Cursor()
	for k, v := c.Seek([]byte(from)); k != nil; k, v = c.Next() {
		if to != "" && string(k) > to {
			break
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}
