package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/limiter"
	"breakwater/storage/postgres/pgtest"
)

// BenchmarkMoneyReadCycle drives the money path of accepted reads over two
// instances on one database, with the ceilings on: per read, the daily
// user's rate window, the line's attempt and the quota's slot in one
// write (TakeAndReserve), the
// brake's Claim and Commit, and the usage record with its settlement, as
// the guard runs them. It reports
// accepted reads per second and PostgreSQL transactions per read (from
// pg_stat_database.xact_commit, every instance's, heartbeats and leases
// included; the target is at most 1.2) and the money path's own
// transactions per read (its group commits and leases), and PostgreSQL's
// CPU per read (pg-µs/read, its sessions' for this database, as
// BenchmarkReadRowsFloor measures it; the database must then run on this
// machine), for concurrency 1, 16 and 64. At concurrency 1 a read's two
// transactions go in turn, each its own group: its time per read is what
// the storage adds to one client's latency.
//
//	go test -run '^$' -bench MoneyReadCycle -benchtime 2000x ./storage/postgres
func BenchmarkMoneyReadCycle(b *testing.B) {
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) { benchCycles(b, conc) })
	}
}

func benchCycles(b *testing.B, conc int) {
	url := pgtest.NewDatabase(b)
	in := [2]*instance{openInstance(b, url), openInstance(b, url)}
	cfg := budget.Config{DailyRequests: 10_000_000, DailyUSD: 100_000, MonthlyUSD: 1_000_000}
	brakes := [2]*budget.Global{newBrake(b, in[0], cfg), newBrake(b, in[1], cfg)}
	rate := limiter.Config{Rate: 1_000_000, Window: time.Minute}.WithDefaults()
	windows := [2]limiter.Joined{{Store: in[0].db.Limits().Windows("user"), Config: rate, Enforce: true},
		{Store: in[1].db.Limits().Windows("user"), Config: rate, Enforce: true}}
	before := xactCommits(b, url, false)
	cpu := backendCPU(b, url)
	var next, failed atomic.Int64
	b.ResetTimer()
	start := time.Now()
	done := make(chan struct{})
	for w := range conc {
		go func() {
			defer func() { done <- struct{}{} }()
			for next.Add(1) <= int64(b.N) {
				if err := readCycle(in[w%2], brakes[w%2], windows[w%2], fmt.Sprintf("user%d", w)); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	for range conc {
		<-done
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu = backendCPU(b, url) - cpu // before the sessions end
	for i, g := range brakes {
		if err := g.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
		_ = in[i].m.Close(context.Background())
		in[i].db.Close()
	}
	if failed.Load() > 0 {
		b.Fatalf("%d of %d cycles failed", failed.Load(), b.N)
	}
	groups := in[0].m.Transactions() + in[1].m.Transactions()
	txs := xactCommits(b, url, true) - before
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "reads/s")
	b.ReportMetric(float64(txs)/float64(b.N), "tx/read")
	b.ReportMetric(float64(groups)/float64(b.N), "groups/read")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "pg-µs/read")
}

// readCycle is one accepted read's money path.
func readCycle(in *instance, g *budget.Global, window limiter.Joined, user string) error {
	ctx := context.Background()
	q := in.m.Quotas()
	slot, refused, take, err := q.TakeAndReserve(user, window, 0, true, 1<<40, testNow)
	if refused != nil {
		return refused
	}
	if take != nil {
		return take
	}
	if err != nil {
		return err
	}
	r, err := g.Claim(1000, testNow)
	if err != nil {
		q.Release(slot)
		return err
	}
	if err := g.Commit(ctx, &r); err != nil {
		q.Release(slot)
		return err
	}
	if err := in.m.RecordUsage(ctx, slot.Month, usageRecord(user), r.Settlement(400)); err != nil {
		return err
	}
	g.Settled(r, 400)
	q.Confirm(slot)
	return nil
}

// xactCommits is the database's committed transactions so far; settled,
// it first waits for every other session to end, since a session reports
// its counts when it ends (or when idle for a while).
func xactCommits(b *testing.B, url string, settled bool) int64 {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for settled {
		var others int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()").Scan(&others)
		if err != nil {
			b.Fatal(err)
		}
		if others == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // closed sessions exit in the background
	}
	var n int64
	if _, err := conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		b.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}
