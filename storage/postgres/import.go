package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/server/keys"
)

// The import of a bolt database (`breakwater migrate --from`): each call
// stores records as they are, leaves alone what is already stored, and
// reports how many it added, so that a second copy copies nothing twice;
// the money's figures are added to, not left alone (ImportLedger).
// Each runs in one transaction; nothing here notifies the instances, since
// they are stopped during a migration.

// importChunk is how many rows one statement of an import carries: each
// kind is a few statements of arrays (unnest), not a statement a row, so
// that 100,000 keys take about a second.
const importChunk = 10_000

// ImportUsers stores the users that are not stored yet.
func (db *DB) ImportUsers(ctx context.Context, users []keys.User) (int, error) {
	return db.importRows(ctx, "users", len(users), func(lo, hi int) (string, []any) {
		ids, plans, banned, created := make([]string, 0, hi-lo), make([]string, 0, hi-lo), make([]bool, 0, hi-lo), make([]time.Time, 0, hi-lo)
		for _, u := range users[lo:hi] {
			ids, plans, banned, created = append(ids, u.ID), append(plans, u.Plan), append(banned, u.Banned), append(created, u.CreatedAt)
		}
		return `INSERT INTO users (id, plan, banned, created_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::boolean[], $4::timestamptz[]) ON CONFLICT DO NOTHING`,
			[]any{ids, plans, banned, created}
	})
}

// ImportKeys stores the keys (hash and revocation as they are) whose id and
// hash are not stored yet: every key keeps working.
func (db *DB) ImportKeys(ctx context.Context, list []keys.Key) (int, error) {
	return db.importRows(ctx, "keys", len(list), func(lo, hi int) (string, []any) {
		ids, hashes, users := make([]string, 0, hi-lo), make([][]byte, 0, hi-lo), make([]string, 0, hi-lo)
		created, revoked := make([]time.Time, 0, hi-lo), make([]*time.Time, 0, hi-lo)
		for _, k := range list[lo:hi] {
			ids, hashes, users = append(ids, k.ID), append(hashes, k.Hash[:]), append(users, k.UserID)
			created, revoked = append(created, k.CreatedAt), append(revoked, nullTime(k.RevokedAt))
		}
		return `INSERT INTO api_keys (id, hash, user_id, created_at, revoked_at)
			SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::timestamptz[], $5::timestamptz[]) ON CONFLICT DO NOTHING`,
			[]any{ids, hashes, users, created, revoked}
	})
}

// ImportInviteKeyMark stores the mark of the secret the imported invites
// are keyed with, unless a mark is stored: RekeyInvites then leaves them
// as they are when the instances run with that secret.
func (db *DB) ImportInviteKeyMark(ctx context.Context, mark []byte) (int, error) {
	return db.importBatch(ctx, "invite key", 1, func(b *pgx.Batch, _ int) {
		b.Queue(`INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING`, metaInviteKey, mark)
	})
}

// ImportUsage stores the usage rows that are not stored yet (a row is
// known by its time, request id and user). cal is the budget's calendar,
// in whose zone a row's day and month are counted.
func (db *DB) ImportUsage(ctx context.Context, rows []budget.UsageRecord, cal *budget.Calendar) (int, error) {
	bodies := make([][]byte, len(rows))
	for i, rec := range rows {
		body, err := json.Marshal(rec)
		if err != nil {
			return 0, fmt.Errorf("import usage: %w", err)
		}
		bodies[i] = body
	}
	return db.importRows(ctx, "usage rows", len(rows), func(lo, hi int) (string, []any) {
		n := hi - lo
		at, days, users, keyIDs, requests := make([]time.Time, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		cost, in, out, models := make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]string, 0, n)
		for _, rec := range rows[lo:hi] {
			at, days, users = append(at, rec.Time), append(days, cal.Day(rec.Time)), append(users, rec.UserID)
			keyIDs, requests, cost = append(keyIDs, rec.KeyID), append(requests, rec.RequestID), append(cost, rec.CostMicroUSD)
			in, out = append(in, int64(rec.PromptTokens)), append(out, int64(rec.CandidatesTokens+rec.ThoughtsTokens))
			models = append(models, rec.Model)
		}
		return `INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd,
				input_tokens, output_tokens, simulated, model, body)
			SELECT r.at, r.day, left(r.day, 7), r.user_id, r.key_id, r.request_id, 1, r.micro_usd, r.input_tokens, r.output_tokens, false, r.model, r.body
			FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::text[], $10::bytea[])
				AS r (at, day, user_id, key_id, request_id, micro_usd, input_tokens, output_tokens, model, body)
			WHERE NOT EXISTS (SELECT 1 FROM usage_rows u WHERE u.at = r.at AND u.request_id = r.request_id AND u.user_id = r.user_id)`,
			[]any{at, days, users, keyIDs, requests, cost, in, out, models, bodies[lo:hi]}
	})
}

// The money a bolt database brings (its ledger days and quota counts) is
// added to what the database holds, not skipped where a day or a user's
// month is already there: instances may have served that day already, and
// a skipped figure is spend the ceilings no longer see. Each source (a
// bolt file's database_id) is recorded with what it added
// (imported_days, imported_quotas) in the transaction that adds it, so a
// rerun adds nothing and a file that served more since adds the rest; a
// figure lower than recorded (an older copy of the same file) adds
// nothing, never takes away.

// Overlap is what a database already holds of a source's figures, not
// brought by that source: the days and users a merge would add to.
type Overlap struct {
	Days  []string     // ledger days with spend or calls
	Users []MonthUsers // quota counts of the same months
}

// MonthUsers are a month's users with a quota count.
type MonthUsers struct {
	Month string
	Users []string
}

// Empty reports whether nothing overlaps.
func (o Overlap) Empty() bool { return len(o.Days) == 0 && len(o.Users) == 0 }

// ImportOverlap finds the days of days and, month by month, the users of
// quotas for which the database holds figures that source did not bring.
func (db *DB) ImportOverlap(ctx context.Context, source string, days []budget.LedgerDay, quotas map[string]map[string]int64) (Overlap, error) {
	var o Overlap
	names := make([]string, len(days))
	for i, d := range days {
		names[i] = d.Day
	}
	rows, err := db.pool.Query(ctx, `SELECT l.day FROM ledger_days l
		WHERE l.day = ANY($1) AND (l.calls > 0 OR l.micro_usd > 0)
		  AND NOT EXISTS (SELECT 1 FROM imported_days i WHERE i.source = $2 AND i.day = l.day)
		ORDER BY l.day`, names, source)
	if err != nil {
		return o, fmt.Errorf("import overlap: %w", err)
	}
	if o.Days, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return o, fmt.Errorf("import overlap: %w", err)
	}
	months := make([]string, 0, len(quotas))
	for m := range quotas {
		months = append(months, m)
	}
	slices.Sort(months)
	for _, month := range months {
		users := make([]string, 0, len(quotas[month]))
		for u, n := range quotas[month] {
			if n > 0 {
				users = append(users, u)
			}
		}
		rows, err := db.pool.Query(ctx, `SELECT q.user_id FROM quota_counts q
			WHERE q.month = $1 AND q.user_id = ANY($2) AND q.used > 0
			  AND NOT EXISTS (SELECT 1 FROM imported_quotas i WHERE i.source = $3 AND i.month = q.month AND i.user_id = q.user_id)
			ORDER BY q.user_id`, month, users, source)
		if err != nil {
			return o, fmt.Errorf("import overlap: %w", err)
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return o, fmt.Errorf("import overlap: %w", err)
		}
		if len(found) > 0 {
			o.Users = append(o.Users, MonthUsers{Month: month, Users: found})
		}
	}
	return o, nil
}

// ImportQuotas adds to month's quota counts what source's counts hold
// beyond what it added before, and returns how many users' counts grew.
func (db *DB) ImportQuotas(ctx context.Context, source, month string, used map[string]int64) (int, error) {
	users, counts := make([]string, 0, len(used)), make([]int64, 0, len(used))
	for u, n := range used {
		users, counts = append(users, u), append(counts, n)
	}
	return db.importRowsOf(ctx, source, "quotas", len(users), func(lo, hi int) (string, []any) {
		return `WITH src AS (
				SELECT s.user_id, s.used, greatest(s.used - coalesce(i.used, 0), 0) AS more
				FROM unnest($1::text[], $2::bigint[]) AS s (user_id, used)
				LEFT JOIN imported_quotas i ON i.source = $3 AND i.month = $4 AND i.user_id = s.user_id),
			noted AS (
				INSERT INTO imported_quotas (source, month, user_id, used) SELECT $3, $4, user_id, used FROM src
				ON CONFLICT (source, month, user_id) DO UPDATE SET used = greatest(imported_quotas.used, excluded.used))
			INSERT INTO quota_counts AS q (user_id, month, used) SELECT user_id, $4, more FROM src WHERE more > 0
			ON CONFLICT (user_id, month) DO UPDATE SET used = q.used + excluded.used`,
			[]any{users[lo:hi], counts[lo:hi], source, month}
	})
}

// ImportLedger adds to the ledger's days, each with its settled cost
// (settled by day), and to their months, what source's days hold beyond
// what it added before, and returns how many days grew.
func (db *DB) ImportLedger(ctx context.Context, source string, days []budget.LedgerDay, settled map[string]int64) (int, error) {
	return db.importBatchOf(ctx, source, "ledger days", len(days), func(b *pgx.Batch, i int) {
		d := days[i]
		b.Queue(`WITH before AS (
				SELECT coalesce(max(calls), 0) AS calls, coalesce(max(micro_usd), 0) AS micro_usd, coalesce(max(settled_micro_usd), 0) AS settled
				FROM imported_days WHERE source = $1 AND day = $2),
			more AS (
				SELECT greatest($3 - calls, 0) AS calls, greatest($4 - micro_usd, 0) AS micro_usd, greatest($5 - settled, 0) AS settled FROM before),
			noted AS (
				INSERT INTO imported_days (source, day, calls, micro_usd, settled_micro_usd) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (source, day) DO UPDATE SET calls = greatest(imported_days.calls, excluded.calls),
					micro_usd = greatest(imported_days.micro_usd, excluded.micro_usd),
					settled_micro_usd = greatest(imported_days.settled_micro_usd, excluded.settled_micro_usd)),
			month AS (
				INSERT INTO ledger_months AS m (month, micro_usd) SELECT left($2, 7), micro_usd FROM more WHERE micro_usd > 0
				ON CONFLICT (month) DO UPDATE SET micro_usd = m.micro_usd + excluded.micro_usd)
			INSERT INTO ledger_days AS l (day, calls, micro_usd, settled_micro_usd, settled_calls)
			SELECT $2, calls, micro_usd, settled, calls FROM more WHERE calls > 0 OR micro_usd > 0 OR settled > 0
			ON CONFLICT (day) DO UPDATE SET calls = l.calls + excluded.calls, micro_usd = l.micro_usd + excluded.micro_usd,
				settled_micro_usd = l.settled_micro_usd + excluded.settled_micro_usd, settled_calls = l.settled_calls + excluded.settled_calls`,
			source, d.Day, d.Requests, d.SpendMicroUSD, settled[d.Day])
	})
}

// ImportFlag stores an operator switch that is not set yet.
func (db *DB) ImportFlag(ctx context.Context, name string, on bool) (int, error) {
	return db.importBatch(ctx, "flags", 1, func(b *pgx.Batch, _ int) {
		b.Queue(`INSERT INTO flags (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING`, name, map[bool]string{false: "0", true: "1"}[on])
	})
}

// importRows runs the statements chunk makes for rows [lo, hi) of n, at
// most importChunk rows each, in one transaction, and returns how many
// rows they added.
func (db *DB) importRows(ctx context.Context, what string, n int, chunk func(lo, hi int) (string, []any)) (int, error) {
	return db.importRowsOf(ctx, "", what, n, chunk)
}

// importRowsOf is importRows holding source's lock (lockSource) when
// source is not "".
func (db *DB) importRowsOf(ctx context.Context, source, what string, n int, chunk func(lo, hi int) (string, []any)) (int, error) {
	if n == 0 {
		return 0, nil
	}
	added := 0
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		added = 0
		if err := lockSource(ctx, tx, source); err != nil {
			return err
		}
		for lo := 0; lo < n; lo += importChunk {
			sql, args := chunk(lo, min(lo+importChunk, n))
			tag, err := tx.Exec(ctx, sql, args...)
			if err != nil {
				return err
			}
			added += int(tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("import %s: %w", what, err)
	}
	return added, nil
}

// importBatch queues n statements in one transaction and returns how many
// rows they added.
func (db *DB) importBatch(ctx context.Context, what string, n int, queue func(b *pgx.Batch, i int)) (int, error) {
	return db.importBatchOf(ctx, "", what, n, queue)
}

// importBatchOf is importBatch holding source's lock (lockSource) when
// source is not "".
func (db *DB) importBatchOf(ctx context.Context, source, what string, n int, queue func(b *pgx.Batch, i int)) (int, error) {
	if n == 0 {
		return 0, nil
	}
	b := &pgx.Batch{}
	for i := range n {
		queue(b, i)
	}
	added := 0
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		added = 0
		if err := lockSource(ctx, tx, source); err != nil {
			return err
		}
		res := tx.SendBatch(ctx, b)
		for range n {
			tag, err := res.Exec()
			if err != nil {
				res.Close()
				return err
			}
			added += int(tag.RowsAffected())
		}
		return res.Close()
	})
	if err != nil {
		return 0, fmt.Errorf("import %s: %w", what, err)
	}
	return added, nil
}

// lockSource takes, for tx's life, the lock of one source's import: two
// runs of the same file at once would each read what it added before and
// add the rest twice.
func lockSource(ctx context.Context, tx pgx.Tx, source string) error {
	if source == "" {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('breakwater import ' || $1, 0))", source)
	return err
}
