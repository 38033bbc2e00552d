package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// The usage record ("$"): a paid read's quota increment, its usage row and
// its budget settlement, in one transaction committed before RecordUsage
// returns, shared with whatever else is being written (the group commit):
// under load an accepted read does not cost a transaction of its own. The
// quota increment also ends this instance's hold on the read's slot, in the
// same transaction, so that the read never counts twice nor not at all.

// RecordUsage commits rec's quota increment (quota_counts of month), its
// usage row, the end of its quota hold and settlement s (a zero Settlement
// settles nothing), and rec.Answer when MoneyOptions.KeepAnswer is set, in
// one durable transaction. On an error nothing of rec was written. ctx
// bounds only the wait for a place in the group commit.
func (m *Money) RecordUsage(ctx context.Context, month string, rec budget.UsageRecord, s budget.Settlement) error {
	if rec.UserID == "" || rec.Time.IsZero() {
		return errors.New("postgres: a usage record needs a user and a time")
	}
	if len(month) != len("2006-01") || !validDay(month+"-01") {
		return fmt.Errorf("postgres: usage record in %q: not a month", month)
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("postgres: encode the usage record: %w", err)
	}
	settle, err := settleSteps(s, m.owner)
	if err != nil {
		return err
	}
	var used int64
	op := &groupOp{reset: func() { used = 0 }, steps: append(settle,
		step{rank: rankUser, key: userKey(rec.UserID, userQuota, month), row: &rowStep{kind: rowQuota, user: rec.UserID, period: month, n: 1, value: &used}},
		step{rank: rankUser, key: userKey(rec.UserID, userHolds, month) + holdEnd, row: &rowStep{kind: rowHoldEnd, user: rec.UserID, period: month, owner: m.owner, n: 1}},
		step{rank: rankInsert, queue: func(b *pgx.Batch) {
			at := rec.Time.In(m.loc)
			b.Queue(`INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd,
				input_tokens, output_tokens, simulated, model, body) VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8, $9, $10, $11, $12)`,
				rec.Time, m.cal.Day(at), month, rec.UserID, rec.KeyID, rec.RequestID, rec.CostMicroUSD,
				rec.PromptTokens, rec.CandidatesTokens+rec.ThoughtsTokens, rec.Answer != nil && rec.Answer.Simulated, rec.Model, body)
		}},
	)}
	if rec.Answer != nil && m.keep != nil {
		var keepErr error
		op.steps = append(op.steps, step{rank: rankInsert, queue: func(b *pgx.Batch) { keepErr = m.keep(b, rec) }})
		prev := op.reset
		op.reset = func() { prev(); keepErr = nil }
		defer func() {
			if keepErr != nil {
				m.log.Error("postgres: queue the kept answer", "error", keepErr)
			}
		}()
	}
	if err := m.do(ctx, op); err != nil {
		return fmt.Errorf("postgres: usage record of %s: %w", rec.UserID, err)
	}
	m.cache.setUsed(rec.UserID, month, used)
	return nil
}

// UsageBody decodes a usage row's body.
func UsageBody(body []byte) (budget.UsageRecord, error) {
	var rec budget.UsageRecord
	if err := json.Unmarshal(body, &rec); err != nil {
		return budget.UsageRecord{}, fmt.Errorf("postgres: usage row: %w", err)
	}
	return rec, nil
}
