package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
)

// BenchmarkReadRowsFloor is the least CPU PostgreSQL can spend on the rows
// an accepted read must write for the guarantees across instances
// (pgtest.FloorReads: set-based over a group of distinct users, one
// session, no round trip per statement). It reports pg-µs/read,
// PostgreSQL's CPU per read, to set beside BenchmarkMoneyReadCycle's
// figure of the same name (the money path as it is: requests from two
// instances, a round trip per group, 64 sessions' worth of switching).
// from-client is the same rows sent from a client, a statement a row
// (pgtest.FloorFromClient): what the protocol and the per-row statements
// add before any logic of Breakwater's. The database must run on this
// machine (its backends' CPU is read from /proc).
//
//	go test -run '^$' -bench 'ReadRowsFloor|MoneyReadCycle/concurrency=64' -benchtime 20000x ./storage/postgres
func BenchmarkReadRowsFloor(b *testing.B) {
	for _, group := range []int{5, 20} {
		b.Run(fmt.Sprintf("group=%d", group), func(b *testing.B) { benchFloor(b, group, false) })
	}
	b.Run("group=5/from-client", func(b *testing.B) { benchFloor(b, 5, true) })
}

func benchFloor(b *testing.B, group int, fromClient bool) {
	url := pgtest.NewDatabase(b)
	openInstance(b, url) // the schema
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, pgtest.FloorSetup); err != nil {
		b.Fatal(err)
	}
	groups := max(b.N/group, 1)
	script := pgtest.FloorReads(groups, group)
	cpu := backendCPU(b, url)
	b.ResetTimer()
	if fromClient {
		err = pgtest.FloorFromClient(ctx, conn, groups, group)
	} else {
		_, err = conn.Exec(ctx, script)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64((backendCPU(b, url)-cpu).Microseconds())/float64(groups*group), "pg-µs/read")
}

// backendCPU is the CPU time the sessions of url's database have used so
// far, read from /proc (the database must run on this machine; a session
// that ended is not counted).
func backendCPU(b *testing.B, url string) time.Duration {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	var cpu time.Duration
	for _, pid := range pids {
		_, own, _, ok := pgtest.ProcCPU(int(pid))
		if !ok {
			b.Fatalf("the database's sessions must run on this machine: no /proc/%d/stat", pid)
		}
		cpu += own
	}
	return cpu
}
