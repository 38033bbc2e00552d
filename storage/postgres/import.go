package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/server/keys"
)

// The import of a bolt database (`breakwater migrate --from`): each call
// stores records as they are, leaves alone what is already stored, and
// reports how many it added, so that a second copy copies nothing twice.
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

// ImportQuotas stores month's quota counts of the users that have none.
func (db *DB) ImportQuotas(ctx context.Context, month string, used map[string]int64) (int, error) {
	users, counts := make([]string, 0, len(used)), make([]int64, 0, len(used))
	for u, n := range used {
		users, counts = append(users, u), append(counts, n)
	}
	return db.importRows(ctx, "quotas", len(users), func(lo, hi int) (string, []any) {
		return `INSERT INTO quota_counts (user_id, month, used)
			SELECT u, $2, n FROM unnest($1::text[], $3::bigint[]) AS q (u, n) ON CONFLICT DO NOTHING`,
			[]any{users[lo:hi], month, counts[lo:hi]}
	})
}

// ImportLedger stores the ledger's days that are not stored yet, each with
// its settled costs (settled by day), and adds each new day's spend to its
// month.
func (db *DB) ImportLedger(ctx context.Context, days []budget.LedgerDay, settled map[string]int64) (int, error) {
	return db.importBatch(ctx, "ledger days", len(days), func(b *pgx.Batch, i int) {
		d := days[i]
		b.Queue(`WITH added AS (
				INSERT INTO ledger_days (day, calls, micro_usd, settled_micro_usd, settled_calls) VALUES ($1, $2, $3, $4, $2)
				ON CONFLICT DO NOTHING RETURNING micro_usd)
			INSERT INTO ledger_months (month, micro_usd) SELECT $5, micro_usd FROM added
			ON CONFLICT (month) DO UPDATE SET micro_usd = ledger_months.micro_usd + excluded.micro_usd`,
			d.Day, d.Requests, d.SpendMicroUSD, settled[d.Day], d.Day[:len("2006-01")])
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
	if n == 0 {
		return 0, nil
	}
	added := 0
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		added = 0
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
