package storage

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
)

const month = "2026-03"

// usageAt returns a valid usage record for user at t.
func usageAt(user string, t time.Time) budget.UsageRecord {
	return budget.UsageRecord{
		Time: t, UserID: user, KeyID: "k-" + user, RequestID: "r-" + t.Format(time.RFC3339Nano),
		Model: "gemini", Outcome: "ok", Bytes: 1234, PromptTokens: 10, CandidatesTokens: 5,
		ThoughtsTokens: 1, CostMicroUSD: 42, LatencyMS: 300,
	}
}

func TestRecordUsageConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breakwater.db")
	db, err := Open(path, Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}

	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			user := fmt.Sprintf("u%d", i%3)
			errs <- db.RecordUsage(t.Context(), month, usageAt(user, t0.Add(time.Duration(i)*time.Millisecond)), budget.Settlement{})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("RecordUsage: %v", err)
		}
	}
	t.Logf("%d records in %d transactions", db.answered.Load(), db.txs.Load())

	check := func(t *testing.T, db *DB) {
		t.Helper()
		used, err := db.QuotaUsed(month)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, c := range used {
			total += c
		}
		if got, want := total, int64(n); got != want {
			t.Errorf("sum of QuotaUsed = %d, want %d (%v)", got, want, used)
		}
		if got, want := used["u0"], int64(67); got != want {
			t.Errorf("QuotaUsed[u0] = %d, want %d", got, want)
		}
		rows, err := db.Usage(time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(rows), n; got != want {
			t.Fatalf("len(Usage) = %d, want %d", got, want)
		}
		for i := 1; i < len(rows); i++ {
			if rows[i].Time.Before(rows[i-1].Time) {
				t.Fatalf("Usage not in time order at %d: %v before %v", i, rows[i].Time, rows[i-1].Time)
			}
		}
		if got, want := rows[0], usageAt("u0", t0); !got.Time.Equal(want.Time) || got.RequestID != want.RequestID || got.CostMicroUSD != want.CostMicroUSD {
			t.Errorf("first row = %+v, want %+v", got, want)
		}
	}
	check(t, db)

	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.RecordUsage(t.Context(), month, usageAt("u0", t0), budget.Settlement{}); !errors.Is(err, ErrClosed) {
		t.Errorf("RecordUsage after Close = %v, want ErrClosed", err)
	}

	t.Run("after reopen", func(t *testing.T) {
		check(t, mustOpenPath(t, path, Options{}))
	})
}

func TestRecordUsageInvalid(t *testing.T) {
	db := mustOpen(t)
	tests := []struct {
		name  string
		month string
		rec   budget.UsageRecord
	}{
		{name: "no user", month: month, rec: usageAt("", t0)},
		{name: "zero time", month: month, rec: usageAt("u1", time.Time{})},
		{name: "bad month", month: "2026-3", rec: usageAt("u1", t0)},
		{name: "day not month", month: "2026-03-01", rec: usageAt("u1", t0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := db.RecordUsage(t.Context(), tt.month, tt.rec, budget.Settlement{}); !errors.Is(err, ErrInvalid) {
				t.Errorf("RecordUsage = %v, want ErrInvalid", err)
			}
		})
	}
	used, err := db.QuotaUsed(month)
	if err != nil {
		t.Fatal(err)
	}
	if len(used) != 0 {
		t.Errorf("QuotaUsed after refused records = %v, want empty", used)
	}
	if _, err := db.QuotaUsed("March"); !errors.Is(err, ErrInvalid) {
		t.Errorf("QuotaUsed(bad month) = %v, want ErrInvalid", err)
	}
}

// TestRecordUsageBadRecordFailsAlone holds the writer so that good records
// queue up for one batch while a bad record is sent: the bad one is refused
// before it reaches the writer (rows are checked and encoded on the
// caller's goroutine), and every good one commits in one transaction.
func TestRecordUsageBadRecordFailsAlone(t *testing.T) {
	db := mustOpen(t)
	const good = 20

	release := make(chan struct{})
	holding := make(chan struct{})
	go db.commit(t.Context(), func(*bbolt.Tx) error {
		close(holding)
		<-release
		return nil
	})
	<-holding // the writer is inside the holding transaction

	var wg sync.WaitGroup
	for i := range good {
		wg.Go(func() {
			if err := db.RecordUsage(t.Context(), month, usageAt("good", t0.Add(time.Duration(i))), budget.Settlement{}); err != nil {
				t.Errorf("good RecordUsage: %v", err)
			}
		})
	}
	// The writer is held, so an answer now cannot have come from it.
	if err := db.RecordUsage(t.Context(), month, usageAt("", t0), budget.Settlement{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad RecordUsage = %v, want ErrInvalid", err)
	}
	waitQueued(t, db, good)
	if n := len(db.queue); n != good {
		t.Errorf("%d writes queued, want the %d good ones", n, good)
	}
	txsBefore := db.txs.Load()
	close(release)
	wg.Wait()
	used, err := db.QuotaUsed(month)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := used["good"], int64(good); got != want {
		t.Errorf("QuotaUsed[good] = %d, want %d", got, want)
	}
	if got, want := len(used), 1; got != want {
		t.Errorf("QuotaUsed has %d users, want %d: %v", got, want, used)
	}
	rows, err := db.Usage(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rows), good; got != want {
		t.Errorf("len(Usage) = %d, want %d", got, want)
	}
	// The holder's transaction, then the queued batch in one.
	if got, want := db.txs.Load()-txsBefore, int64(2); got != want {
		t.Errorf("transactions after release = %d, want %d", got, want)
	}
}

// waitQueued waits until n requests are in the commit queue. It yields
// instead of sleeping: the goroutines it waits for are already running.
func waitQueued(t *testing.T, db *DB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for len(db.queue) < n {
		if ctx.Err() != nil {
			t.Fatalf("queue holds %d requests, want %d", len(db.queue), n)
		}
		runtime.Gosched()
	}
}

func TestUsageRange(t *testing.T) {
	db := mustOpen(t)
	times := []time.Time{
		t0.Add(2 * time.Second),
		t0,
		t0.Add(time.Second),
		t0.Add(time.Second), // equal times must both be kept
		t0.Add(3 * time.Second),
		time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC), // before 1970 sorts first
	}
	for i, at := range times {
		rec := usageAt("u1", at)
		rec.RequestID = fmt.Sprint(i)
		if err := db.RecordUsage(t.Context(), month, rec, budget.Settlement{}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name     string
		from, to time.Time
		want     []string // request ids
	}{
		{name: "all", want: []string{"5", "1", "2", "3", "0", "4"}},
		{name: "from inclusive to exclusive", from: t0.Add(time.Second), to: t0.Add(3 * time.Second), want: []string{"2", "3", "0"}},
		{name: "open start", to: t0.Add(time.Second), want: []string{"5", "1"}},
		{name: "open end", from: t0.Add(3 * time.Second), want: []string{"4"}},
		{name: "empty", from: t0.Add(time.Hour), to: t0.Add(2 * time.Hour), want: nil},
		{name: "to before from", from: t0.Add(3 * time.Second), to: t0, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := db.Usage(tt.from, tt.to)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rows {
				got = append(got, r.RequestID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Usage = %v, want %v", got, tt.want)
			}
		})
	}
}

// BenchmarkRecordUsage compares group commit with one bbolt Update (one
// fsync) per record, under the same parallel load, with real fsync.
//
// Both report ops/s. b.TempDir must be on a disk where fsync is real (not
// tmpfs) for the comparison to mean anything.
func BenchmarkRecordUsage(b *testing.B) {
	modes := []struct {
		name   string
		record func(db *DB, rec budget.UsageRecord) error
	}{
		{"group-commit", func(db *DB, rec budget.UsageRecord) error {
			return db.RecordUsage(context.Background(), month, rec, budget.Settlement{})
		}},
		{"update-per-record", func(db *DB, rec budget.UsageRecord) error {
			return db.update(func(tx *bbolt.Tx) error { return recordUsage(tx, month, rec) })
		}},
	}
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			db := mustOpen(b)
			var seq atomic.Int64
			b.SetParallelism(64)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					rec := usageAt(fmt.Sprintf("u%d", i%50), t0.Add(time.Duration(i)))
					if err := mode.record(db, rec); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			if txs := db.txs.Load(); txs > 0 {
				b.ReportMetric(float64(db.answered.Load())/float64(txs), "records/tx")
			}
		})
	}
}
