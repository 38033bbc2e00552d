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
// calls, and money committed in micro-dollars. A lease (Lease) adds a
// block of headroom to the day before the calls it covers are made; each
// call's settlement replaces its worst case by its actual cost; the rest
// of a lease that no call used is given back by a later write. A call
// that is never settled (the process died during it), and a lease's rest
// that is never given back (the process died), therefore keep counting,
// which is what makes the budget hold across a crash.
//
//	budget_days:  "2006-01-02" -> 16 bytes: requests, spend (uint64 each)
//	reservations: 8-byte id    -> JSON {"day":…,"worst":…} (earlier versions)
//
// Leases keep no row: the day totals carry the money. The reservations
// bucket holds only the open rows of earlier versions, which wrote one per
// call; a database may still hold such a row from a call that was under
// way when the old binary stopped, so they are still read and settled.

type openReservation struct {
	Day   string `json:"day"`
	Worst int64  `json:"worst"`
}

// decodeReservation reads a reservation row of an earlier version.
func decodeReservation(v []byte) (openReservation, error) {
	var r openReservation
	if err := json.Unmarshal(v, &r); err != nil {
		return openReservation{}, fmt.Errorf("reservation row: %w", err)
	}
	return r, nil
}

// Lease durably adds calls and microUSD to day ("2006-01-02"), and
// subtracts each giveBack from its own day (never below zero), in one
// transaction through group commit. day may be "" when calls and microUSD
// are 0 (a write that only gives back).
func (db *DB) Lease(ctx context.Context, day string, calls, microUSD int64, giveBack ...budget.LedgerDay) error {
	if calls < 0 || microUSD < 0 {
		return fmt.Errorf("%w: negative lease", ErrInvalid)
	}
	if calls != 0 || microUSD != 0 {
		if err := checkDay(day); err != nil {
			return err
		}
	}
	for _, b := range giveBack {
		if err := checkDay(b.Day); err != nil {
			return err
		}
		if b.Requests < 0 || b.SpendMicroUSD < 0 {
			return fmt.Errorf("%w: negative lease given back", ErrInvalid)
		}
	}
	err := db.commit(ctx, func(tx *bbolt.Tx) error {
		if calls != 0 || microUSD != 0 {
			d := readBudgetDay(tx, day)
			d.Requests += calls
			d.SpendMicroUSD += microUSD
			if err := writeBudgetDay(tx, day, d); err != nil {
				return err
			}
		}
		for _, b := range giveBack {
			d := readBudgetDay(tx, b.Day)
			d.Requests = max(d.Requests-b.Requests, 0)
			d.SpendMicroUSD = max(d.SpendMicroUSD-b.SpendMicroUSD, 0)
			if err := writeBudgetDay(tx, b.Day, d); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lease budget on %s: %w", day, err)
	}
	return nil
}

// Settle settles one call at its actual cost through group commit (see
// budget.Settlement for its kinds). An unknown or already settled
// reservation id changes nothing.
func (db *DB) Settle(ctx context.Context, s budget.Settlement) error {
	if s == (budget.Settlement{}) {
		return nil
	}
	return db.commit(ctx, func(tx *bbolt.Tx) error { return settle(tx, s) })
}

// settle is the transaction part of Settle, shared with RecordUsage.
func settle(tx *bbolt.Tx, s budget.Settlement) error {
	if s.ActualMicroUSD < 0 || s.LeasedMicroUSD < 0 {
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
		// A leased call is in the day's requests already, and the part
		// of its cost the lease counted in its spend.
		d := readBudgetDay(tx, s.Day)
		if !s.Leased {
			d.Requests++
		}
		d.SpendMicroUSD += s.ActualMicroUSD - s.LeasedMicroUSD
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

// OpenReservations counts the reservation rows of earlier versions not
// yet settled (leases keep no row).
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
