package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"breakwater/budget"
	"breakwater/storage"
)

// The disk's own limit, as a control for the accepted path: the durable
// writes one accepted read needs, made through storage's group commit by
// as many goroutines as the load has connections, in this process, with
// no HTTP, no upstream and no guard. The accepted cases cannot pass it;
// how close they come is what the rest of the request path costs.

// diskControl is one control run.
type diskControl struct {
	label string
	rps   float64 // reads' durable writes per second
	txs   float64 // transactions (each with its fsyncs) per second
}

// diskControls measures the control with the ceilings on (the budget's
// own ledger writes before the call, made by a budget.Global as the server
// makes them, and the usage record after it) and off (the usage record
// only), each for the plan's measured time.
func (b *bench) diskControls() ([]diskControl, error) {
	var out []diskControl
	for _, reserve := range []bool{true, false} {
		c, err := b.diskControl(reserve)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func (b *bench) diskControl(reserve bool) (diskControl, error) {
	label := "usage record per read (ceilings off)"
	if reserve {
		label = "budget ledger + usage record per read (ceilings on)"
	}
	path := filepath.Join(b.dir, fmt.Sprintf("control-%t.db", reserve))
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		return diskControl{}, fmt.Errorf("disk control: %w", err)
	}
	defer db.Close()
	ctx := context.Background()
	now := time.Now().UTC()
	day, month := budget.DayKey(now, time.UTC), budget.MonthKey(now, time.UTC)
	var brake *budget.Global
	if reserve {
		brake, err = budget.NewGlobal(budget.Config{DailyRequests: 1e9, DailyUSD: 1e9, MonthlyUSD: 1e9}, time.UTC, db,
			budget.GlobalState{Day: day, Month: month})
		if err != nil {
			return diskControl{}, fmt.Errorf("disk control: %w", err)
		}
		defer brake.Close(ctx)
	}
	var reads atomic.Int64
	var firstErr error
	var errOnce sync.Once
	stop := time.Now().Add(b.plan.warmup + b.plan.duration)
	measureFrom := time.Now().Add(b.plan.warmup)
	var wg sync.WaitGroup
	for i := range b.plan.clients {
		wg.Go(func() {
			user := fmt.Sprintf("control-%d", i%2) // one user's rows, as the 1-user case
			for time.Now().Before(stop) {
				s := budget.Settlement{Day: day, ActualMicroUSD: 150}
				var claim budget.Reservation
				if brake != nil {
					var err error
					if claim, err = brake.Claim(1000, time.Now()); err == nil {
						err = brake.Commit(ctx, &claim)
					}
					if err != nil {
						errOnce.Do(func() { firstErr = err })
						return
					}
					s = claim.Settlement(150)
				}
				rec := budget.UsageRecord{Time: time.Now(), UserID: user, KeyID: "k", RequestID: "r", Model: "m", Outcome: "ok",
					Bytes: 1000, PromptTokens: 298, CandidatesTokens: 24, CostMicroUSD: 150}
				if err := db.RecordUsage(ctx, month, rec, s); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if brake != nil {
					brake.Settled(claim, 150)
				}
				if t := time.Now(); !t.Before(measureFrom) && t.Before(stop) {
					reads.Add(1)
				}
			}
		})
	}
	time.Sleep(time.Until(measureFrom))
	txs0 := db.Transactions()
	wg.Wait()
	txs := db.Transactions() - txs0
	if firstErr != nil {
		return diskControl{}, fmt.Errorf("disk control: %w", firstErr)
	}
	secs := b.plan.duration.Seconds()
	return diskControl{label: label, rps: float64(reads.Load()) / secs, txs: float64(txs) / secs}, nil
}

// printControls writes the control's table, beside the accepted cases it
// bounds.
func (r *report) printControls(w io.Writer) {
	if len(r.controls) != 2 {
		return
	}
	fmt.Fprintln(w, "control: the disk alone (storage's group commit from one goroutine per connection, in the harness, no HTTP)")
	fmt.Fprintf(w, "%-52s %10s %10s   %s\n", "durable writes of an accepted read", "reads/s", "txs/s", "accepted, 1 user, over it")
	for i, id := range []string{"acc1on", "acc1off"} {
		c := r.controls[i]
		fmt.Fprintf(w, "%-52s %10s %10s   %.2f\n", c.label, thousands(c.rps), thousands(c.txs), r.figure(id).rps/c.rps)
	}
	fmt.Fprintln(w)
}
