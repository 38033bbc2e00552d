package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
// one durable transaction. On an error nothing of rec was written, except
// on one wrapping budget.ErrMaybeCommitted: the transaction's connection
// failed after its commit was sent, and whether it committed could not be
// read back (outcome.go); one that did commit is no error. ctx bounds only
// the wait for a place in the group commit.
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
	op := &groupOp{what: "usage record", then: m.recordRead(rec.UserID, month, s), reset: func() { used = 0 }, steps: append(settle,
		step{rank: rankUser, key: userKey(rec.UserID, userQuota, month), row: &rowStep{kind: rowQuota, user: rec.UserID, period: month, n: 1, value: &used}},
		step{rank: rankUser, key: userKey(rec.UserID, userHolds, month) + holdEnd, row: &rowStep{kind: rowHoldEnd, user: rec.UserID, period: month, owner: m.owner, n: 1}},
		step{rank: rankInsert, key: usageKey, usage: &usageRow{rec: rec, day: m.cal.Day(rec.Time.In(m.loc)), month: month, body: body}},
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
	err = m.do(ctx, op)
	if errors.Is(err, errUnread) { // committed: only the count it read is lost
		used, err = m.usedNow(rec.UserID, month), nil
	}
	if err != nil {
		return fmt.Errorf("postgres: usage record of %s: %w", rec.UserID, err)
	}
	m.cache.setUsed(rec.UserID, month, used)
	return nil
}

// recordRead is what is left to do for a usage record of user in month,
// settling s, whose outcome was in doubt (its caller, told
// budget.ErrMaybeCommitted, neither confirmed nor gave back its quota
// slot, and counted its call at its worst case) once it is read back:
// committed, the slot is used; not committed, the slot is given back and
// the call settled, as after a failed record.
func (m *Money) recordRead(user, month string, s budget.Settlement) func(committed bool) {
	return func(committed bool) {
		m.cache.addInFlight(user, month, -1)
		if committed {
			m.cache.setUsed(user, month, m.usedNow(user, month))
			return
		}
		m.releases.add(user, month, 1)
		m.retryReleases()
		if s == (budget.Settlement{}) {
			return
		}
		ctx, cancel := m.ctx()
		defer cancel()
		if err := m.Settle(ctx, s); err != nil {
			m.log.Warn("postgres: the call of a usage record that did not commit is not settled: it counts at its worst case", "user", user, "error", err)
		}
	}
}

// usedNow reads user's recorded reads in month, or the cache's count
// plus one if the database cannot answer.
func (m *Money) usedNow(user, month string) int64 {
	ctx, cancel := m.ctx()
	defer cancel()
	var used int64
	err := m.db.pool.QueryRow(ctx, "SELECT coalesce(max(used), 0) FROM quota_counts WHERE user_id = $1 AND month = $2", user, month).Scan(&used)
	if err != nil {
		c := &m.cache
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.at(month) {
			return 1
		}
		return c.used[user] + 1
	}
	return used
}

// UsageBody decodes a usage row's body.
func UsageBody(body []byte) (budget.UsageRecord, error) {
	var rec budget.UsageRecord
	if err := json.Unmarshal(body, &rec); err != nil {
		return budget.UsageRecord{}, fmt.Errorf("postgres: usage row: %w", err)
	}
	return rec, nil
}

// usageKey sorts a group's usage rows next to each other, after its other
// inserts (a new row locks nothing another writer waits on: where it goes
// among them does not matter).
const usageKey = "usage_rows"

// usageRow is one usage row to insert; a group's are one statement
// (mergeUsage).
type usageRow struct {
	rec        budget.UsageRecord
	day, month string
	body       []byte
}

// mergeUsage replaces a group's usage rows (sorted steps: next to each
// other, in the callers' order) by one statement that inserts them all,
// in that order.
func mergeUsage(steps []step) []step {
	return mergeRuns(steps, func(s step) bool { return s.usage != nil }, func(a, b step) bool { return true }, func(run []step) step {
		return step{rank: run[0].rank, key: run[0].key, queue: queueUsage(run)}
	})
}

// usageColumns are usage rows column by column, as unnest takes them.
type usageColumns struct {
	at                                    []time.Time
	day, month, user, key, request, model []string
	cost, input, output                   []int64
	simulated                             []bool
	body                                  [][]byte
}

func (c *usageColumns) add(u *usageRow) {
	rec := u.rec
	c.at = append(c.at, rec.Time)
	c.day, c.month = append(c.day, u.day), append(c.month, u.month)
	c.user, c.key, c.request = append(c.user, rec.UserID), append(c.key, rec.KeyID), append(c.request, rec.RequestID)
	c.model = append(c.model, rec.Model)
	c.cost = append(c.cost, rec.CostMicroUSD)
	c.input, c.output = append(c.input, int64(rec.PromptTokens)), append(c.output, int64(rec.CandidatesTokens+rec.ThoughtsTokens))
	c.simulated = append(c.simulated, rec.Answer != nil && rec.Answer.Simulated)
	c.body = append(c.body, u.body)
}

// queueUsage queues the insert of run's usage rows.
func queueUsage(run []step) func(b *pgx.Batch) {
	var c usageColumns
	for _, s := range run {
		c.add(s.usage)
	}
	return func(b *pgx.Batch) {
		b.Queue(`INSERT INTO usage_rows (at, day, month, user_id, key_id, request_id, calls, micro_usd, input_tokens,
			output_tokens, simulated, model, body)
			SELECT at, day, month, user_id, key_id, request_id, 1, micro_usd, input_tokens, output_tokens, simulated, model, body
			FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[],
			    $8::bigint[], $9::bigint[], $10::boolean[], $11::text[], $12::bytea[])
			    AS r(at, day, month, user_id, key_id, request_id, micro_usd, input_tokens, output_tokens, simulated, model, body)`,
			c.at, c.day, c.month, c.user, c.key, c.request, c.cost, c.input, c.output, c.simulated, c.model, c.body)
	}
}
