package pgtest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The floor of PostgreSQL's work per accepted read: the rows a read must
// write for the guarantees across instances, with nothing else. Its
// admission: the user's rate window head and slot, the day's attempt,
// the quota count's lock, the holds' sum read and this instance's hold,
// committed without waiting for the disk; its usage record: the usage
// row, the quota count, the hold's end, the ledger's day, committed with
// it. One session, no round trip per statement (one DO block), every
// statement set-based over a group of reads of distinct users, as the
// money path commits them. BenchmarkReadRowsFloor (storage/postgres) and
// bench/load's postgres run measure it; the schema must exist (an
// instance made it), and FloorSetup runs once per database.

// FloorSetup is the instance and the users' window heads the floor's
// reads find.
const FloorSetup = `
INSERT INTO money_owners (owner, started_at, seen_at) VALUES ('floor', now(), now());
INSERT INTO ledger_days (day) VALUES ('2026-12-03');
INSERT INTO limit_window_heads (name, key, seq, cap, newest)
    SELECT 'user', 'u' || i, 1, 100000, 0 FROM generate_series(0, 63) i`

// FloorReads is the script that writes groups groups of group reads,
// each group's users distinct (64 users in turn), each statement over
// the whole group.
func FloorReads(groups, group int) string {
	return strings.NewReplacer("$groups", strconv.Itoa(groups), "$group", strconv.Itoa(group)).Replace(floorReads)
}

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

// FloorFromClient writes the rows of FloorReads(groups, group) as a client
// sends them: each row its own statement (the usage rows one insert, as
// the money path's), a group's admissions in one pipelined transaction and
// its usage records in another, from one session. Beside FloorReads it
// measures what the protocol and the per-row statements cost before any
// of Breakwater's own logic: what a path that sends a statement per row
// from the instances pays for that alone.
func FloorFromClient(ctx context.Context, conn *pgx.Conn, groups, group int) error {
	body := []byte(strings.Repeat("x", 300))
	users := make([]string, group)
	for k := range groups {
		for i := range users {
			users[i] = "u" + strconv.Itoa((k*group+i)%64)
		}
		slices.Sort(users)
		admit := &pgx.Batch{}
		admit.Queue("SELECT set_config('synchronous_commit', 'off', true)")
		for _, u := range users {
			admit.Queue("SELECT 1 FROM limit_window_heads WHERE name = 'user' AND key = $1 FOR UPDATE", u)
			admit.Queue("UPDATE limit_window_heads SET seq = seq + 1, newest = $2 WHERE name = 'user' AND key = $1", u, k)
			admit.Queue(`INSERT INTO limit_window_slots (name, key, slot, t) VALUES ('user', $1, $2, $3)
				ON CONFLICT (name, key, slot) DO UPDATE SET t = excluded.t`, u, k%1000, k)
			admit.Queue(`INSERT INTO attempt_counts AS a (user_id, day, count) VALUES ($1, '2026-12-03', 1)
				ON CONFLICT (user_id, day) DO UPDATE SET count = a.count + 1`, u)
			admit.Queue("SELECT 1 FROM quota_counts WHERE user_id = $1 AND month = '2026-12' FOR UPDATE", u)
			admit.Queue(`SELECT sum(x.n) FROM quota_holds x JOIN money_owners o ON o.owner = x.owner
				WHERE x.user_id = $1 AND x.month = '2026-12'`, u)
			admit.Queue(`INSERT INTO quota_holds AS h (user_id, month, owner, n) VALUES ($1, '2026-12', 'floor', 1)
				ON CONFLICT (user_id, month, owner) DO UPDATE SET n = h.n + 1`, u)
		}
		if err := conn.SendBatch(ctx, admit).Close(); err != nil {
			return fmt.Errorf("the floor's admissions: %w", err)
		}
		record := &pgx.Batch{}
		record.Queue(`INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd, input_tokens,
				output_tokens, simulated, model, body)
			SELECT now(), '2026-12-03', '2026-12', u, 'key', md5(u || $2::bigint), 1, 400, 100, 20, false, 'model', $3
			FROM unnest($1::text[]) u`, users, k, body)
		for _, u := range users {
			record.Queue(`INSERT INTO quota_counts AS q (user_id, month, used) VALUES ($1, '2026-12', 1)
				ON CONFLICT (user_id, month) DO UPDATE SET used = q.used + 1`, u)
			record.Queue("UPDATE quota_holds SET n = greatest(n - 1, 0) WHERE user_id = $1 AND month = '2026-12' AND owner = 'floor'", u)
		}
		record.Queue("UPDATE ledger_days SET calls = calls + $1, micro_usd = micro_usd + 400 * $1 WHERE day = '2026-12-03'", group)
		if err := conn.SendBatch(ctx, record).Close(); err != nil {
			return fmt.Errorf("the floor's usage records: %w", err)
		}
	}
	return nil
}
