package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"breakwater/budget"
)

// Settlements written together share one group transaction, which sums
// them into one update of each ledger row: 200 usage records at once on
// two instances (leased calls settled below, at and above their lease,
// and calls no lease counted) leave the day, the month and each
// instance's rest exactly as their sum, and the groups did carry several
// records each (so the sum, not one update per record, was what ran).
func TestSummedSettlementsKeepTheLedgerExact(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	ctx := context.Background()
	const perInstance, worst = 100, 1000
	for _, x := range in {
		if _, ok, err := x.m.LeaseUnder(ctx, "2026-12-03", perInstance/2, perInstance/2*worst, budget.Ceilings{}); err != nil || !ok {
			t.Fatalf("LeaseUnder: %v %v", ok, err)
		}
	}
	var (
		wg   sync.WaitGroup
		want int64 // micro-dollars settled
	)
	for i := range 2 * perInstance {
		actual := int64(i%3) * worst / 2 // 0, 500, 1000...
		if i%5 == 0 {
			actual = 1700 // above its lease
		}
		s := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: actual}
		if i%4 < 2 { // half the calls leased, half never leased
			s.Leased, s.LeasedMicroUSD = true, worst
		}
		want += actual
		rec := usageRecord(fmt.Sprintf("u%d", i%7))
		rec.RequestID = fmt.Sprintf("r%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := in[i%2].m.RecordUsage(ctx, "2026-12", rec, s); err != nil {
				t.Errorf("RecordUsage: %v", err)
			}
		}()
	}
	wg.Wait()
	d, settled, err := in[0].m.LedgerDay(ctx, "2026-12-03")
	if err != nil {
		t.Fatal(err)
	}
	if d.Requests != 2*perInstance || d.SpendMicroUSD != want || settled != want {
		t.Fatalf("ledger day %+v settled %d, want %d calls, %d µ$ spent and settled", d, settled, 2*perInstance, want)
	}
	var month, calls, restCalls, restMicro int64
	pool := in[1].db.Pool()
	if err := pool.QueryRow(ctx, "SELECT micro_usd FROM ledger_months WHERE month = '2026-12'").Scan(&month); err != nil || month != want {
		t.Fatalf("ledger month %d (%v), want %d", month, err, want)
	}
	if err := pool.QueryRow(ctx, "SELECT settled_calls FROM ledger_days WHERE day = '2026-12-03'").Scan(&calls); err != nil || calls != 2*perInstance {
		t.Fatalf("settled calls %d (%v), want %d", calls, err, 2*perInstance)
	}
	err = pool.QueryRow(ctx, "SELECT coalesce(sum(calls), 0), coalesce(sum(micro_usd), 0) FROM ledger_rests WHERE day = '2026-12-03'").Scan(&restCalls, &restMicro)
	if err != nil || restCalls != 0 || restMicro != 0 {
		t.Fatalf("rests %d calls %d µ$ (%v), want every lease settled", restCalls, restMicro, err)
	}
	for _, x := range in {
		if w, tx := x.m.Writes(), x.m.Transactions(); w <= tx {
			t.Fatalf("an instance carried %d writes in %d transactions: no group held more than one record", w, tx)
		}
	}
}
