package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"breakwater/budget"
)

// softCycles runs n parallel reads through ClaimSoft over brakes (read i
// on brakes[i%len]), claimed at primary or fallback micro-dollars,
// committed and settled at their worst case, while each brake refreshes
// its view as serve does (more often); it returns the reads on each side.
func softCycles(t *testing.T, brakes []*budget.Global, n int, primary, fallback int64) (onPrimary, onFallback int) {
	t.Helper()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	ctx := context.Background()
	done := make(chan struct{})
	var refreshing sync.WaitGroup
	for _, g := range brakes {
		refreshing.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := g.Refresh(ctx, testNow); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for i := range n {
		wg.Go(func() {
			g := brakes[i%len(brakes)]
			r, err := g.ClaimSoft(primary, fallback, testNow)
			if err == nil {
				err = g.Commit(ctx, &r)
			}
			if err != nil {
				t.Errorf("read %d: %v", i, err)
				return
			}
			if (r.Degraded == "") != (r.Worst == primary) {
				t.Errorf("claim %+v: its side and its worst case disagree", r)
			}
			if err := g.Settle(ctx, r, r.Worst); err != nil {
				t.Errorf("Settle: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if r.Degraded == "" {
				onPrimary++
			} else {
				onFallback++
			}
		})
	}
	wg.Wait()
	close(done)
	refreshing.Wait()
	for _, g := range brakes {
		if err := g.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return onPrimary, onFallback
}

// 150 reads at once over three instances, soft_daily_requests = 100
// under daily_requests = 200: exactly 100 go to the primary model, the
// ledger deciding the side with every instance's calls counted; the
// ledger then holds the 150 calls. With soft_daily_usd at 10.5 primary
// claims' worth, exactly 10: their worst cases within one of the line.
// Fails with the side read from each instance's view before the claim.
func TestSoftLineAcrossInstances(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		cfg         budget.Config
		n           int
		wantPrimary int
	}{
		{"soft_daily_requests", budget.Config{DailyRequests: 200, SoftDailyRequests: 100}, 150, 100},
		{"soft_daily_requests, no hard ceiling", budget.Config{SoftDailyRequests: 100}, 150, 100},
		{"soft_daily_usd", budget.Config{DailyUSD: 1, SoftDailyUSD: 0.0105}, 60, 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := migratedDatabase(t)
			var brakes []*budget.Global
			var ins []*instance
			for range 3 {
				in := openInstance(t, url)
				ins = append(ins, in)
				brakes = append(brakes, newBrake(t, in, tt.cfg))
			}
			p, f := softCycles(t, brakes, tt.n, 1000, 100)
			if p != tt.wantPrimary || f != tt.n-tt.wantPrimary {
				t.Errorf("%d reads on the primary, %d on the fallback; want %d and %d", p, f, tt.wantPrimary, tt.n-tt.wantPrimary)
			}
			d, settled, err := ins[0].m.LedgerDay(context.Background(), "2026-12-03")
			if err != nil {
				t.Fatal(err)
			}
			want := budget.DayTotals{Requests: int64(tt.n), SpendMicroUSD: int64(p)*1000 + int64(f)*100}
			if d != want || settled != want.SpendMicroUSD {
				t.Errorf("the ledger's day: %+v, %d settled; want %+v", d, settled, want)
			}
		})
	}
}

// Primary headroom is leased only under the soft ceilings: an instance
// whose view is stale (it has not seen the other's calls) still sends
// the read over the line to the fallback, as the ledger says, and marks
// it as the first on that side.
func TestSoftLineStaleViewAsksTheLedger(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	cfg := budget.Config{DailyRequests: 10, SoftDailyRequests: 3}
	a, b := openInstance(t, url), openInstance(t, url)
	ga, gb := newBrake(t, a, cfg), newBrake(t, b, cfg)
	ctx := context.Background()
	for i := range 3 {
		r, err := ga.ClaimSoft(1000, 100, testNow)
		if err == nil {
			err = ga.Commit(ctx, &r)
		}
		if err != nil || r.Degraded != "" {
			t.Fatalf("A's read %d: %+v, %v; want the primary", i+1, r, err)
		}
	}
	r, err := gb.ClaimSoft(1000, 100, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if r.Degraded != "" || r.Worst != 1000 {
		t.Fatalf("B's claim before its commit: %+v; want primary in B's view", r)
	}
	if err := gb.Commit(ctx, &r); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%s %d %v", r.Degraded, r.Worst, r.NewSide); got != "soft_daily_requests 100 true" {
		t.Errorf("B's read after its commit: %q (side, worst case, new side); want the fallback, at its worst case, new", got)
	}
}
