package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
)

// TestBudgetLeaseSettle leases headroom, settles calls covered by it (in a
// usage record's transaction and on their own), gives the rest back, and
// reads the totals back from the file after a reopen.
func TestBudgetLeaseSettle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.db")
	db := mustOpenPath(t, path, Options{})
	ctx := t.Context()
	const day = "2026-11-30"

	// A lease of 4 calls at 1000 µ$ each; three calls take from it.
	if err := db.Lease(ctx, day, 4, 4000); err != nil {
		t.Fatal(err)
	}
	if got, want := mustBudget(t, db, day), (budget.DayTotals{Requests: 4, SpendMicroUSD: 4000}); got != want {
		t.Errorf("after the lease: %+v, want %+v", got, want)
	}
	rec := budget.UsageRecord{Time: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), UserID: "u"}
	leased := budget.Settlement{Day: day, Leased: true, LeasedMicroUSD: 1000, ActualMicroUSD: 300}
	if err := db.RecordUsage(ctx, "2026-11", rec, leased); err != nil {
		t.Fatal(err)
	}
	leased.ActualMicroUSD = 0 // a call cancelled before it was made
	if err := db.Settle(ctx, leased); err != nil {
		t.Fatal(err)
	}
	// The third is under way. A new day's lease gives the old day's rest
	// (one call, 1000 µ$) back in the same write.
	const next = "2026-12-01"
	if err := db.Lease(ctx, next, 2, 500, budget.LedgerDay{Day: day, DayTotals: budget.DayTotals{Requests: 1, SpendMicroUSD: 1000}}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	db = mustOpenPath(t, path, Options{})
	// 3 calls: 300 settled, 0 cancelled, 1000 open at its worst case.
	if got, want := mustBudget(t, db, day), (budget.DayTotals{Requests: 3, SpendMicroUSD: 1300}); got != want {
		t.Errorf("day %+v, want %+v", got, want)
	}
	if got, want := mustBudget(t, db, next), (budget.DayTotals{Requests: 2, SpendMicroUSD: 500}); got != want {
		t.Errorf("next day %+v, want %+v", got, want)
	}
	// A write that only gives back: the new day's lease, unused.
	if err := db.Lease(ctx, "", 0, 0, budget.LedgerDay{Day: next, DayTotals: budget.DayTotals{Requests: 2, SpendMicroUSD: 500}}); err != nil {
		t.Fatal(err)
	}
	if got := mustBudget(t, db, next); got != (budget.DayTotals{}) {
		t.Errorf("next day after the give-back: %+v, want zero", got)
	}
	// Giving back more than the day holds stops at zero.
	if err := db.Lease(ctx, "", 0, 0, budget.LedgerDay{Day: next, DayTotals: budget.DayTotals{Requests: 1, SpendMicroUSD: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := mustBudget(t, db, next); got != (budget.DayTotals{}) {
		t.Errorf("next day after giving back too much: %+v, want zero", got)
	}
	if month, err := db.BudgetMonth("2026-11"); err != nil || month != 1300 {
		t.Errorf("November %d %v, want 1300", month, err)
	}
	if n, _ := db.OpenReservations(); n != 0 {
		t.Errorf("%d open reservations, want 0: leases keep no row", n)
	}

	for _, tt := range []struct {
		name string
		err  error
	}{
		{"negative calls", db.Lease(ctx, day, -1, 0)},
		{"negative money", db.Lease(ctx, day, 1, -1)},
		{"bad day", db.Lease(ctx, "30.11.2026", 1, 1)},
		{"no day", db.Lease(ctx, "", 1, 1)},
		{"bad give-back day", db.Lease(ctx, "", 0, 0, budget.LedgerDay{Day: "x"})},
		{"negative give-back", db.Lease(ctx, "", 0, 0, budget.LedgerDay{Day: day, DayTotals: budget.DayTotals{Requests: -1}})},
		{"leased settlement without a day", db.Settle(ctx, budget.Settlement{Leased: true, LeasedMicroUSD: 1})},
		{"negative worst case", db.Settle(ctx, budget.Settlement{Day: day, Leased: true, LeasedMicroUSD: -1})},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, ErrInvalid) {
				t.Errorf("%v, want ErrInvalid", tt.err)
			}
		})
	}
	if got, want := mustBudget(t, db, day), (budget.DayTotals{Requests: 3, SpendMicroUSD: 1300}); got != want {
		t.Errorf("after the refused writes: day %+v, want %+v", got, want)
	}
}

func TestBudgetLeaseConcurrent(t *testing.T) {
	db := mustOpen(t)
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if err := db.Lease(t.Context(), "2026-11-30", 1, 10); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	day, _ := db.Budget("2026-11-30")
	if day.Requests != 100 || day.SpendMicroUSD != 1000 {
		t.Errorf("day %+v, want 100 requests and 1000", day)
	}
}

// putReservation writes an open reservation row as earlier versions did
// (JSON), with its day's totals as their Reserve left them, and returns
// its id.
func putReservation(t *testing.T, db *DB, day string, worst int64) uint64 {
	t.Helper()
	var id uint64
	row, err := json.Marshal(openReservation{Day: day, Worst: worst})
	if err != nil {
		t.Fatal(err)
	}
	err = db.commit(t.Context(), func(tx *bbolt.Tx) error {
		open := tx.Bucket(bucketReservations)
		seq, err := open.NextSequence()
		if err != nil {
			return err
		}
		id = seq
		if err := open.Put(encodeUint64(seq), row); err != nil {
			return err
		}
		d := readBudgetDay(tx, day)
		d.Requests++
		d.SpendMicroUSD += worst
		return writeBudgetDay(tx, day, d)
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestSettleOldReservations: reservation rows of earlier versions, left
// open by a stop, settle at their actual cost (in a usage record or on
// their own, once) and are removed; one never settled keeps counting at
// its worst case across a reopen.
func TestSettleOldReservations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.db")
	db := mustOpenPath(t, path, Options{})
	ctx := t.Context()
	id1 := putReservation(t, db, "2026-11-30", 1000)
	putReservation(t, db, "2026-11-30", 1000)
	rec := budget.UsageRecord{Time: time.Now(), UserID: "u"}
	if err := db.RecordUsage(ctx, "2026-11", rec, budget.Settlement{ID: id1, ActualMicroUSD: 300}); err != nil {
		t.Fatal(err)
	}
	if err := db.Settle(ctx, budget.Settlement{ID: id1, ActualMicroUSD: 5}); err != nil { // twice: no change
		t.Fatal(err)
	}
	putReservation(t, db, "2026-11-29", 70)
	db.Close()

	db = mustOpenPath(t, path, Options{})
	if got, want := mustBudget(t, db, "2026-11-30"), (budget.DayTotals{Requests: 2, SpendMicroUSD: 1300}); got != want {
		t.Errorf("day %+v, want %+v (300 settled + 1000 open at worst case)", got, want)
	}
	month, err := db.BudgetMonth("2026-11")
	if err != nil {
		t.Fatal(err)
	}
	if month != 1370 {
		t.Errorf("month %d, want 1370", month)
	}
	if n, _ := db.OpenReservations(); n != 2 {
		t.Errorf("%d open reservations, want 2", n)
	}
	if _, err := db.Budget("30.11.2026"); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad day: %v", err)
	}
	if other, _ := db.BudgetMonth("2026-12"); other != 0 {
		t.Errorf("December %d, want 0", other)
	}
}

func TestDefenseState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.db")
	db := mustOpenPath(t, path, Options{})
	if err := db.SaveState("attempts/2026-11-29", map[string][]byte{"a": {1}}); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveState("attempts/2026-11-30", map[string][]byte{"a": {2}, "b": {3}}); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveState("attempts/2026-11-30", map[string][]byte{"b": nil}); err != nil {
		t.Fatal(err)
	}
	if err := db.DropStates("attempts/", "attempts/2026-11-30"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = mustOpenPath(t, path, Options{})
	old, _ := db.LoadState("attempts/2026-11-29")
	now, err := db.LoadState("attempts/2026-11-30")
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != 0 || len(now) != 1 || now["a"][0] != 2 {
		t.Errorf("old %v, now %v", old, now)
	}
	if none, err := db.LoadState("never"); err != nil || len(none) != 0 {
		t.Errorf("missing state: %v %v", none, err)
	}
}

func TestLatestBudgetDay(t *testing.T) {
	db := mustOpen(t)
	if day, err := db.LatestBudgetDay(); err != nil || day != "" {
		t.Fatalf("empty ledger: %q, %v", day, err)
	}
	for _, day := range []string{"2026-03-10", "2026-04-01", "2026-03-31"} {
		if err := db.Lease(context.Background(), day, 1, 5); err != nil {
			t.Fatal(err)
		}
	}
	if day, err := db.LatestBudgetDay(); err != nil || day != "2026-04-01" {
		t.Fatalf("latest %q, %v; want 2026-04-01", day, err)
	}
}

// TestSettleUnreservedCall: a call whose reservation was never written
// (layer 3 failed open) reaches the ledger through its settlement, as one
// request and its actual cost; a zero Settlement adds nothing.
func TestSettleUnreservedCall(t *testing.T) {
	db := mustOpen(t)
	ctx := context.Background()
	const day = "2026-03-10"
	if err := db.Settle(ctx, budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Settle(ctx, budget.Settlement{Day: day, ActualMicroUSD: 700}); err != nil {
		t.Fatal(err)
	}
	rec := budget.UsageRecord{Time: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC), UserID: "u", RequestID: "r1", Outcome: "ok", CostMicroUSD: 300}
	if err := db.RecordUsage(ctx, "2026-03", rec, budget.Settlement{Day: day, ActualMicroUSD: 300}); err != nil {
		t.Fatal(err)
	}
	if err := db.RecordUsage(ctx, "2026-03", budget.UsageRecord{Time: rec.Time, UserID: "u", RequestID: "r2", Outcome: "ok"}, budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	got, err := db.Budget(day)
	if err != nil || got != (budget.DayTotals{Requests: 2, SpendMicroUSD: 1000}) {
		t.Errorf("budget %+v, %v; want 2 requests, 1000 µ$", got, err)
	}
	if err := db.Settle(ctx, budget.Settlement{Day: "March 10", ActualMicroUSD: 1}); err == nil {
		t.Error("a malformed day was accepted")
	}
	if err := db.Settle(ctx, budget.Settlement{Day: day, ActualMicroUSD: -1}); err == nil {
		t.Error("a negative cost was accepted")
	}
	if err := db.Settle(ctx, budget.Settlement{ActualMicroUSD: 5}); err == nil {
		t.Error("a cost with neither a reservation nor a day was accepted")
	}
}

// TestSettleReadsOldReservationRows settles reservation rows as earlier
// versions wrote them (a database may hold one from a call under way when
// the old binary stopped): each moves its day from the worst case to the
// actual cost and is removed; a row that is not one is refused, not
// guessed at.
func TestSettleReadsOldReservationRows(t *testing.T) {
	db := mustOpen(t)
	ctx := t.Context()
	const day = "2026-11-30"
	id := putReservation(t, db, day, 1000)
	var raw []byte
	if err := db.view(func(tx *bbolt.Tx) error {
		raw = bytes.Clone(tx.Bucket(bucketReservations).Get(encodeUint64(id)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := `{"day":"2026-11-30","worst":1000}`; string(raw) != want {
		t.Errorf("reservation row %x, want %x", raw, want)
	}
	// A JSON row as the old binary wrote it, with the day's total at its
	// worst case as Reserve left it.
	const oldID = 1 << 40
	err := db.commit(ctx, func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketReservations).Put(encodeUint64(oldID), []byte(`{"day":"2026-11-30","worst":500}`)); err != nil {
			return err
		}
		d := readBudgetDay(tx, day)
		d.Requests++
		d.SpendMicroUSD += 500
		return writeBudgetDay(tx, day, d)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []budget.Settlement{{ID: id, ActualMicroUSD: 30}, {ID: oldID, ActualMicroUSD: 7}} {
		if err := db.Settle(ctx, s); err != nil {
			t.Fatalf("settle %d: %v", s.ID, err)
		}
	}
	if got, want := mustBudget(t, db, day), (budget.DayTotals{Requests: 2, SpendMicroUSD: 37}); got != want {
		t.Errorf("day %+v, want %+v", got, want)
	}
	if n, _ := db.OpenReservations(); n != 0 {
		t.Errorf("%d open reservations, want 0", n)
	}

	for _, bad := range [][]byte{[]byte("2026-13-45\x00\x00\x00\x00\x00\x00\x00\x01"), []byte("junk")} {
		err := db.commit(ctx, func(tx *bbolt.Tx) error { return tx.Bucket(bucketReservations).Put(encodeUint64(7), bad) })
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Settle(ctx, budget.Settlement{ID: 7, ActualMicroUSD: 1}); err == nil {
			t.Errorf("settling row %q: no error", bad)
		}
	}
	if got, want := mustBudget(t, db, day), (budget.DayTotals{Requests: 2, SpendMicroUSD: 37}); got != want {
		t.Errorf("after the bad rows: day %+v, want %+v", got, want)
	}
}

func mustBudget(t *testing.T, db *DB, day string) budget.DayTotals {
	t.Helper()
	d, err := db.Budget(day)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
