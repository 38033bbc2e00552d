package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/server/keys"
)

// The import of a bolt database (`breakwater migrate --from`): each call
// stores records as they are, leaves alone what is already stored, and
// reports how many it added, so that a second copy copies nothing twice.
// Each runs in one transaction; nothing here notifies the instances, since
// they are stopped during a migration.

// ImportUsers stores the users that are not stored yet.
func (db *DB) ImportUsers(ctx context.Context, users []keys.User) (int, error) {
	return db.importBatch(ctx, "users", len(users), func(b *pgx.Batch, i int) {
		u := users[i]
		b.Queue(`INSERT INTO users (id, plan, banned, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
			u.ID, u.Plan, u.Banned, u.CreatedAt)
	})
}

// ImportKeys stores the keys (hash and revocation as they are) whose id and
// hash are not stored yet: every key keeps working.
func (db *DB) ImportKeys(ctx context.Context, list []keys.Key) (int, error) {
	return db.importBatch(ctx, "keys", len(list), func(b *pgx.Batch, i int) {
		k := list[i]
		b.Queue(`INSERT INTO api_keys (id, hash, user_id, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
			k.ID, k.Hash[:], k.UserID, k.CreatedAt, nullTime(k.RevokedAt))
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
// known by its request id, user and time). cal is the budget's calendar,
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
	return db.importBatch(ctx, "usage rows", len(rows), func(b *pgx.Batch, i int) {
		rec := rows[i]
		day := cal.Day(rec.Time)
		b.Queue(`INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd,
				input_tokens, output_tokens, simulated, model, body)
			SELECT $1, $2, $3, $4, $5, $6, 1, $7, $8, $9, false, $10, $11
			WHERE NOT EXISTS (SELECT 1 FROM usage_rows WHERE at = $1 AND request_id = $6 AND user_id = $4)`,
			rec.Time, day, day[:len("2006-01")], rec.UserID, rec.KeyID, rec.RequestID, rec.CostMicroUSD,
			rec.PromptTokens, rec.CandidatesTokens+rec.ThoughtsTokens, rec.Model, bodies[i])
	})
}

// ImportQuotas stores month's quota counts of the users that have none.
func (db *DB) ImportQuotas(ctx context.Context, month string, used map[string]int64) (int, error) {
	users := make([]string, 0, len(used))
	for u := range used {
		users = append(users, u)
	}
	return db.importBatch(ctx, "quotas", len(users), func(b *pgx.Batch, i int) {
		b.Queue(`INSERT INTO quota_counts (user_id, month, used) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, users[i], month, used[users[i]])
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
