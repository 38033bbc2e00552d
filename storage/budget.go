package storage

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"

	"breakwater/budget"
)

// The global budget's ledger. Each day holds two running totals: upstream
// calls reserved, and money committed in micro-dollars. A reservation adds
// its worst-case cost to the day at once and keeps an open row; settling
// replaces the worst case by the actual cost and removes the row. A
// reservation that is never settled (the process died during the call)
// therefore keeps counting at its worst case, which is what makes the
// budget hold across a crash.
//
//	budget_days:  "2006-01-02" -> 16 bytes: requests, spend (uint64 each)
//	reservations: 8-byte id    -> 18 bytes: "2006-01-02", worst case (uint64)
//
// Reservation rows written before the binary form are JSON
// ({"day":…,"worst":…}); a database may still hold such a row from a call
// that was under way when the old binary stopped, so both are read.

type openReservation struct {
	Day   string `json:"day"`
	Worst int64  `json:"worst"`
}

// reservationLen is the size of a binary reservation row.
const reservationLen = len(dayLayout) + 8

// encodeReservation is the row of an open reservation. It is made on the
// caller's goroutine, before the write reaches the writer.
func encodeReservation(day string, worst int64) []byte {
	v := make([]byte, reservationLen)
	copy(v, day)
	binary.BigEndian.PutUint64(v[len(dayLayout):], uint64(worst))
	return v
}

// decodeReservation reads a reservation row in either form.
func decodeReservation(v []byte) (openReservation, error) {
	if len(v) == reservationLen && v[0] != '{' {
		r := openReservation{Day: string(v[:len(dayLayout)]), Worst: int64(binary.BigEndian.Uint64(v[len(dayLayout):]))}
		if err := checkDay(r.Day); err != nil || r.Worst < 0 {
			return openReservation{}, fmt.Errorf("reservation row %x: not a reservation", v)
		}
		return r, nil
	}
	var r openReservation
	if err := json.Unmarshal(v, &r); err != nil {
		return openReservation{}, fmt.Errorf("reservation row: %w", err)
	}
	return r, nil
}

// Reserve durably adds one request and worstMicroUSD to day ("2006-01-02")
// through group commit, and returns the reservation's id for Settle.
func (db *DB) Reserve(ctx context.Context, day string, worstMicroUSD int64) (uint64, error) {
	if err := checkDay(day); err != nil {
		return 0, err
	}
	if worstMicroUSD < 0 {
		return 0, fmt.Errorf("%w: negative reservation", ErrInvalid)
	}
	var id uint64
	row := encodeReservation(day, worstMicroUSD)
	err := db.commit(ctx, func(tx *bbolt.Tx) error {
		open := tx.Bucket(bucketReservations)
		seq, err := open.NextSequence()
		if err != nil {
			return fmt.Errorf("reservation sequence: %w", err)
		}
		if err := open.Put(encodeUint64(seq), row); err != nil {
			return fmt.Errorf("reservation %d: %w", seq, err)
		}
		d := readBudgetDay(tx, day)
		d.Requests++
		d.SpendMicroUSD += worstMicroUSD
		id = seq // the last run is the one that commits
		return writeBudgetDay(tx, day, d)
	})
	if err != nil {
		return 0, fmt.Errorf("reserve budget on %s: %w", day, err)
	}
	return id, nil
}

// Settle closes a reservation at its actual cost through group commit. An
// unknown or already settled id changes nothing; see budget.Settlement for
// ID 0.
func (db *DB) Settle(ctx context.Context, s budget.Settlement) error {
	if s == (budget.Settlement{}) {
		return nil
	}
	return db.commit(ctx, func(tx *bbolt.Tx) error { return settle(tx, s) })
}

// settle is the transaction part of Settle, shared with RecordUsage.
func settle(tx *bbolt.Tx, s budget.Settlement) error {
	if s.ActualMicroUSD < 0 {
		return fmt.Errorf("%w: negative cost", ErrInvalid)
	}
	if s.ID == 0 {
		switch {
		case s == (budget.Settlement{}):
			return nil
		case s.Day == "":
			return fmt.Errorf("%w: a settlement needs a reservation id or a day", ErrInvalid)
		}
		if err := checkDay(s.Day); err != nil {
			return err
		}
		d := readBudgetDay(tx, s.Day)
		d.Requests++
		d.SpendMicroUSD += s.ActualMicroUSD
		return writeBudgetDay(tx, s.Day, d)
	}
	open := tx.Bucket(bucketReservations)
	id := encodeUint64(s.ID)
	v := open.Get(id)
	if v == nil {
		return nil
	}
	r, err := decodeReservation(v)
	if err != nil {
		return err
	}
	d := readBudgetDay(tx, r.Day)
	d.SpendMicroUSD += s.ActualMicroUSD - r.Worst
	if err := writeBudgetDay(tx, r.Day, d); err != nil {
		return err
	}
	return open.Delete(id)
}

// Budget returns day's totals ("2006-01-02"); a day without calls is zero.
func (db *DB) Budget(day string) (budget.DayTotals, error) {
	if err := checkDay(day); err != nil {
		return budget.DayTotals{}, err
	}
	var d budget.DayTotals
	err := db.view(func(tx *bbolt.Tx) error {
		d = readBudgetDay(tx, day)
		return nil
	})
	return d, err
}

// BudgetMonth returns the spend of every day of month ("2006-01") added up.
func (db *DB) BudgetMonth(month string) (int64, error) {
	if err := checkMonth(month); err != nil {
		return 0, err
	}
	var total int64
	err := db.view(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketBudgetDays).Cursor()
		prefix := []byte(month + "-")
		for k, v := c.Seek(prefix); k != nil && len(k) == len(dayLayout) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			total += decodeBudgetDay(v).SpendMicroUSD
		}
		return nil
	})
	return total, err
}

// LatestBudgetDay is the newest day the ledger holds ("2006-01-02"), ""
// if it holds none. A day after today's date means the clock went back.
func (db *DB) LatestBudgetDay() (string, error) {
	var day string
	err := db.view(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketBudgetDays).Cursor()
		for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
			if len(k) == len(dayLayout) {
				day = string(k)
				return nil
			}
		}
		return nil
	})
	return day, err
}

// OpenReservations counts reservations not yet settled.
func (db *DB) OpenReservations() (int, error) {
	var n int
	err := db.view(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bucketReservations).Stats().KeyN
		return nil
	})
	return n, err
}

func readBudgetDay(tx *bbolt.Tx, day string) budget.DayTotals {
	return decodeBudgetDay(tx.Bucket(bucketBudgetDays).Get([]byte(day)))
}

func decodeBudgetDay(v []byte) budget.DayTotals {
	if len(v) != 16 {
		return budget.DayTotals{}
	}
	return budget.DayTotals{Requests: int64(binary.BigEndian.Uint64(v[:8])), SpendMicroUSD: int64(binary.BigEndian.Uint64(v[8:]))}
}

func writeBudgetDay(tx *bbolt.Tx, day string, d budget.DayTotals) error {
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v[:8], uint64(d.Requests))
	binary.BigEndian.PutUint64(v[8:], uint64(max(d.SpendMicroUSD, 0)))
	if err := tx.Bucket(bucketBudgetDays).Put([]byte(day), v); err != nil {
		return fmt.Errorf("budget day %s: %w", day, err)
	}
	return nil
}

// BudgetDays returns the ledger's days from "2006-01-02" to (inclusive) in
// order; days without calls are absent.
func (db *DB) BudgetDays(from, to string) ([]budget.LedgerDay, error) {
	if err := checkDay(from); err != nil {
		return nil, err
	}
	if err := checkDay(to); err != nil {
		return nil, err
	}
	var out []budget.LedgerDay
	err := db.view(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketBudgetDays).Cursor()
		for k, v := c.Seek([]byte(from)); k != nil && string(k) <= to; k, v = c.Next() {
			out = append(out, budget.LedgerDay{Day: string(k), DayTotals: decodeBudgetDay(v)})
		}
		return nil
	})
	return out, err
}
