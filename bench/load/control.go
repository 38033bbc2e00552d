package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
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
	r.printCommits(w)
}

// printCommits writes what the storage writer did under each accepted
// case, from the server's own counters over the measured time. The writer
// is never idle at full load, so the time per commit is the interval over
// the commits; a request waits for one commit to end and then for its own.
func (r *report) printCommits(w io.Writer) {
	fmt.Fprintln(w, "group commit under the load (the server's counters over each measured time; medians of the rounds)")
	fmt.Fprintf(w, "%-42s %10s %12s %12s\n", "case", "commits/s", "writes/commit", "time/commit")
	for _, c := range r.cases {
		if c.bw == nil || c.expect != 200 {
			continue
		}
		f := r.figure(c.id)
		per, each := "–", "–"
		if f.commits > 0 {
			per = strconv.FormatFloat(f.writes/f.commits, 'f', 1, 64)
			each = roundDuration(time.Duration(float64(time.Second) / f.commits))
		}
		fmt.Fprintf(w, "%-42s %10s %12s %12s\n", c.label, thousands(f.commits), per, each)
	}
	if r.fsync.idle > 0 {
		fmt.Fprintf(w, "the disk: fdatasync of one 4 KiB page in the run's directory, p50 %s with the cores idle, %s with another process spinning on all %d\n",
			roundDuration(r.fsync.idle), roundDuration(r.fsync.busy), runtime.NumCPU())
	}
	fmt.Fprintln(w)
}

// fsyncLatency is the disk's flush latency with the machine idle and busy:
// what a commit's two fdatasyncs cost before any work of Breakwater's.
type fsyncLatency struct {
	idle, busy time.Duration // medians
}

// flushPages writes and flushes one page of f, n times over its first
// 256 pages, and returns each write's and flush's latency.
func flushPages(f *os.File, n int) ([]time.Duration, error) {
	page := make([]byte, 4096)
	var out []time.Duration
	for i := range n {
		start := time.Now()
		if _, err := f.WriteAt(page, int64(i%256)*4096); err != nil {
			return nil, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// measureFsync writes and flushes one page of a file in dir, rounds times
// with nothing else running and rounds times while another process keeps
// every core busy (as a loaded server's handlers and the load generator
// do).
func measureFsync(dir string, rounds int) (fsyncLatency, error) {
	f, done, err := flushFile(dir, "fsync-control")
	if err != nil {
		return fsyncLatency{}, fmt.Errorf("fsync control: %w", err)
	}
	defer done()
	idle, err := flushPages(f, rounds)
	if err != nil {
		return fsyncLatency{}, fmt.Errorf("fsync control: %w", err)
	}
	out := fsyncLatency{idle: median(idle)}
	self, err := os.Executable()
	if err != nil {
		return fsyncLatency{}, err
	}
	spinner, err := startProcess("spin", filepath.Join(dir, "spin.log"), childEnv(childKindEnv+"=spin"), self)
	if err != nil {
		return fsyncLatency{}, fmt.Errorf("fsync control: %w", err)
	}
	time.Sleep(200 * time.Millisecond) // its goroutines running
	busy, err := flushPages(f, rounds)
	spinner.stop()
	if err != nil {
		return fsyncLatency{}, fmt.Errorf("fsync control: %w", err)
	}
	out.busy = median(busy)
	return out, nil
}

// diskFigure is the disk's flush latency under the one-client runs of the
// postgres cases: every accepted read waits for at least one flush (its
// usage record is on the disk before its answer, on either backend), so
// no read's added p99 at one client is below the flush's p99.
type diskFigure struct {
	n        int
	p50, p99 time.Duration
}

// probeDisk flushes a page of a file in dir n times, one after another.
func probeDisk(dir string, n int) (diskFigure, error) {
	f, done, err := flushFile(dir, "fsync-probe")
	if err != nil {
		return diskFigure{}, fmt.Errorf("disk probe: %w", err)
	}
	defer done()
	lat, err := flushPages(f, n)
	if err != nil {
		return diskFigure{}, fmt.Errorf("disk probe: %w", err)
	}
	slices.Sort(lat)
	return diskFigure{n: n, p50: lat[n/2], p99: lat[n*99/100]}, nil
}

// flushFile creates the file name in dir for flushPages, with its 256
// pages written and flushed once, so that the flushes measured overwrite
// and allocate no block; done removes it.
func flushFile(dir, name string) (f *os.File, done func(), err error) {
	f, err = os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, nil, err
	}
	done = func() { f.Close(); os.Remove(f.Name()) }
	if _, err := flushPages(f, 256); err != nil {
		done()
		return nil, nil, err
	}
	return f, done, nil
}
