package postgres_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
)

// BenchmarkReadRowsFloor is the least CPU PostgreSQL can spend on the rows
// an accepted read must write for the guarantees across instances: its
// admission (the user's rate window head and slot, the day's attempt, the
// quota count's lock, the holds' sum read and this instance's hold) and its
// usage record (the usage row, the quota count, the hold's end, the
// ledger's day), with nothing else: one session, no round trip per
// statement (one DO block), every statement set-based over a group of
// reads of distinct users, the admissions committed without waiting for
// the disk and the records with it, as the money path commits them. It
// reports pg-µs/read, PostgreSQL's CPU per read, to set beside
// BenchmarkMoneyReadCycle's figure of the same name (the money path as it
// is: requests from two instances, a round trip per group, 64 sessions'
// worth of switching). The database must run on this machine (its
// backends' CPU is read from /proc).
//
//	go test -run '^$' -bench 'ReadRowsFloor|MoneyReadCycle/concurrency=64' -benchtime 20000x ./storage/postgres
func BenchmarkReadRowsFloor(b *testing.B) {
	for _, group := range []int{5, 20} {
		b.Run(fmt.Sprintf("group=%d", group), func(b *testing.B) { benchFloor(b, group) })
	}
}

func benchFloor(b *testing.B, group int) {
	url := pgtest.NewDatabase(b)
	openInstance(b, url) // the schema
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, floorSetup); err != nil {
		b.Fatal(err)
	}
	groups := max(b.N/group, 1)
	script := strings.NewReplacer("$groups", strconv.Itoa(groups), "$group", strconv.Itoa(group)).Replace(floorReads)
	cpu := backendCPU(b, url)
	b.ResetTimer()
	if _, err := conn.Exec(ctx, script); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64((backendCPU(b, url)-cpu).Microseconds())/float64(groups*group), "pg-µs/read")
}

// floorSetup is the instance and the users' window heads the reads find.
const floorSetup = `
INSERT INTO money_owners (owner, started_at, seen_at) VALUES ('floor', now(), now());
INSERT INTO ledger_days (day) VALUES ('2026-12-03');
INSERT INTO limit_window_heads (name, key, seq, cap, newest)
    SELECT 'user', 'u' || i, 1, 100000, 0 FROM generate_series(0, 63) i`

// floorReads writes $groups groups of $group reads, each group's users
// distinct (64 users in turn), each statement over the whole group.
const floorReads = `
DO $$
DECLARE
    users text[];
    body  bytea := convert_to(repeat('x', 300), 'UTF8');
BEGIN
    FOR k IN 0 .. $groups - 1 LOOP
        SELECT array_agg(u ORDER BY u) INTO users
            FROM (SELECT 'u' || ((k * $group + i) % 64) AS u FROM generate_series(0, $group - 1) i) AS g;
        -- The admissions.
        PERFORM set_config('synchronous_commit', 'off', true);
        PERFORM 1 FROM limit_window_heads h WHERE h.name = 'user' AND h.key = ANY (users) ORDER BY h.key FOR UPDATE;
        UPDATE limit_window_heads h SET seq = h.seq + 1, newest = k WHERE h.name = 'user' AND h.key = ANY (users);
        INSERT INTO limit_window_slots (name, key, slot, t) SELECT 'user', u, k % 1000, k FROM unnest(users) u
            ON CONFLICT (name, key, slot) DO UPDATE SET t = excluded.t;
        INSERT INTO attempt_counts AS a (user_id, day, count) SELECT u, '2026-12-03', 1 FROM unnest(users) u ORDER BY u
            ON CONFLICT (user_id, day) DO UPDATE SET count = a.count + 1;
        PERFORM 1 FROM quota_counts q WHERE q.user_id = ANY (users) AND q.month = '2026-12' ORDER BY q.user_id FOR UPDATE;
        PERFORM x.user_id, sum(x.n) FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
            WHERE x.user_id = ANY (users) AND x.month = '2026-12' GROUP BY x.user_id;
        INSERT INTO quota_holds AS h (user_id, month, owner, n) SELECT u, '2026-12', 'floor', 1 FROM unnest(users) u ORDER BY u
            ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + 1;
        COMMIT;
        -- The usage records.
        INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd, input_tokens,
                output_tokens, simulated, model, body)
            SELECT now(), '2026-12-03', '2026-12', u, 'key', md5(u || k), 1, 400, 100, 20, false, 'model', body
            FROM unnest(users) u;
        INSERT INTO quota_counts AS q (user_id, month, used) SELECT u, '2026-12', 1 FROM unnest(users) u ORDER BY u
            ON CONFLICT (user_id, month) DO UPDATE SET used = q.used + 1;
        UPDATE quota_holds h SET n = greatest(h.n - 1, 0)
            WHERE h.user_id = ANY (users) AND h.month = '2026-12' AND h.owner = 'floor';
        UPDATE ledger_days SET calls = calls + $group, micro_usd = micro_usd + 400 * $group WHERE day = '2026-12-03';
        COMMIT;
    END LOOP;
END $$`

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
