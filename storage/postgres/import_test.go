package postgres_test

import (
	"context"
	"sync"
	"testing"

	"breakwater/budget"
)

// An import adds a source's money once: runs of the same source at once
// (an operator's second terminal) add it once between them, a rerun adds
// nothing, a figure that grew adds the rest, a lower one (an older copy of
// the file) takes nothing away, and another source adds its own.
func TestImportAddsEachSourceOnce(t *testing.T) {
	t.Parallel()
	db := open(t, migratedDatabase(t))
	ctx := context.Background()
	day := budget.LedgerDay{Day: "2026-12-06", DayTotals: budget.DayTotals{Requests: 5, SpendMicroUSD: 5000}}
	settled := map[string]int64{day.Day: 4000}
	quotas := map[string]int64{"alice": 3, "bob": 2}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	start := make(chan struct{})
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := db.ImportLedger(ctx, "source-a", []budget.LedgerDay{day}, settled); err != nil {
				errs <- err
			}
			if _, err := db.ImportQuotas(ctx, "source-a", "2026-12", quotas); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	check := func(when string, calls, micro, settledMicro, month, alice, bob int64) {
		t.Helper()
		var c, m, s, sc, mo, a, b int64
		err := db.Pool().QueryRow(ctx, `SELECT calls, micro_usd, settled_micro_usd, settled_calls,
			(SELECT micro_usd FROM ledger_months WHERE month = '2026-12'),
			(SELECT used FROM quota_counts WHERE user_id = 'alice' AND month = '2026-12'),
			(SELECT used FROM quota_counts WHERE user_id = 'bob' AND month = '2026-12')
			FROM ledger_days WHERE day = '2026-12-06'`).Scan(&c, &m, &s, &sc, &mo, &a, &b)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if c != calls || m != micro || s != settledMicro || sc != calls || mo != month || a != alice || b != bob {
			t.Errorf("%s: day %d calls %d µ$ settled %d µ$ (%d calls), month %d µ$, alice %d bob %d; want %d, %d, %d, month %d, alice %d bob %d",
				when, c, m, s, sc, mo, a, b, calls, micro, settledMicro, month, alice, bob)
		}
	}
	check("32 imports at once", 5, 5000, 4000, 5000, 3, 2)

	if n, err := db.ImportLedger(ctx, "source-a", []budget.LedgerDay{day}, settled); err != nil || n != 0 {
		t.Errorf("a rerun added to %d days (%v)", n, err)
	}
	grown := day
	grown.Requests, grown.SpendMicroUSD = 7, 6500
	if _, err := db.ImportLedger(ctx, "source-a", []budget.LedgerDay{grown}, map[string]int64{day.Day: 5500}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ImportQuotas(ctx, "source-a", "2026-12", map[string]int64{"alice": 4, "bob": 1}); err != nil {
		t.Fatal(err)
	}
	check("the source grew (bob's older)", 7, 6500, 5500, 6500, 4, 2)

	if _, err := db.ImportLedger(ctx, "source-b", []budget.LedgerDay{day}, settled); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ImportQuotas(ctx, "source-b", "2026-12", quotas); err != nil {
		t.Fatal(err)
	}
	check("another source", 12, 11500, 9500, 11500, 7, 4)

	o, err := db.ImportOverlap(ctx, "source-c", []budget.LedgerDay{day, {Day: "2026-12-07"}}, map[string]map[string]int64{"2026-12": {"alice": 1, "carol": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Days) != 1 || o.Days[0] != day.Day || len(o.Users) != 1 || len(o.Users[0].Users) != 1 || o.Users[0].Users[0] != "alice" {
		t.Errorf("overlap of a new source: %+v, want the day %s and alice", o, day.Day)
	}
	if o, err := db.ImportOverlap(ctx, "source-a", []budget.LedgerDay{day}, map[string]map[string]int64{"2026-12": quotas}); err != nil || !o.Empty() {
		t.Errorf("overlap of a source with what it brought itself: %+v (%v), want none", o, err)
	}
}
