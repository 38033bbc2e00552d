package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage/postgres"
)

// Usage records sent at once share a group transaction, whose usage rows
// are one insert: each row still carries its own record, column by
// column, and an invalid record in the group fails alone.
func TestUsageRowsOfOneGroupKeepTheirRecords(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	m := in[0].m
	ctx := context.Background()
	const n = 40
	recs := make([]budget.UsageRecord, n)
	for i := range recs {
		recs[i] = budget.UsageRecord{Time: testNow.Add(time.Duration(i) * time.Millisecond), UserID: fmt.Sprintf("user%02d", i%7),
			KeyID: fmt.Sprintf("key%d", i), RequestID: fmt.Sprintf("req%d", i), Model: fmt.Sprintf("model%d", i%3),
			Outcome: "ok", CostMicroUSD: int64(100 + i), PromptTokens: 10 + i, CandidatesTokens: 20 + i, ThoughtsTokens: i,
			Answer: &budget.Answer{Simulated: i%2 == 0}}
	}
	// The first half alone, then the second with a record the database
	// refuses (a NUL in a text column): the group it lands in is run again
	// one record at a time, and only that record fails.
	txs, writes := m.Transactions(), m.Writes()
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := range n / 2 {
		wg.Go(func() { errs[i] = m.RecordUsage(ctx, "2026-12", recs[i], budget.Settlement{}) })
	}
	wg.Wait()
	if dw, dt := m.Writes()-writes, m.Transactions()-txs; dw <= dt {
		t.Fatalf("%d records in %d transactions: no group carried two of them", dw, dt)
	}
	for i := n / 2; i < n; i++ {
		wg.Go(func() { errs[i] = m.RecordUsage(ctx, "2026-12", recs[i], budget.Settlement{}) })
	}
	wg.Go(func() {
		bad := budget.UsageRecord{Time: testNow, UserID: "mallory", KeyID: "k\x00", RequestID: "bad", Model: "m"}
		errs[n] = m.RecordUsage(ctx, "2026-12", bad, budget.Settlement{})
	})
	wg.Wait()
	for i, err := range errs[:n] {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if errs[n] == nil {
		t.Fatal("a record with a NUL in its key was written")
	}

	rows, err := in[1].db.Pool().Query(ctx, `SELECT at, day, month, user_id, key_id, request_id, calls, micro_usd,
		input_tokens, output_tokens, simulated, model, body FROM usage_rows ORDER BY request_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var (
			at                                time.Time
			day, month, user, key, req, model string
			calls                             int
			cost, input, output               int64
			simulated                         bool
			body                              []byte
		)
		if err := rows.Scan(&at, &day, &month, &user, &key, &req, &calls, &cost, &input, &output, &simulated, &model, &body); err != nil {
			t.Fatal(err)
		}
		var i int
		if _, err := fmt.Sscanf(req, "req%d", &i); err != nil || i < 0 || i >= n || got[req] {
			t.Fatalf("unexpected or repeated usage row %q", req)
		}
		got[req] = true
		r := recs[i]
		if !at.Equal(r.Time) || day != "2026-12-03" || month != "2026-12" || user != r.UserID || key != r.KeyID ||
			calls != 1 || cost != r.CostMicroUSD || input != int64(r.PromptTokens) ||
			output != int64(r.CandidatesTokens+r.ThoughtsTokens) || simulated != r.Answer.Simulated || model != r.Model {
			t.Fatalf("row %s: at %v day %s month %s user %s key %s calls %d cost %d in %d out %d simulated %v model %s; want %+v",
				req, at, day, month, user, key, calls, cost, input, output, simulated, model, r)
		}
		back, err := postgres.UsageBody(body)
		if err != nil || back.RequestID != r.RequestID || back.CostMicroUSD != r.CostMicroUSD {
			t.Fatalf("row %s: body %+v, %v", req, back, err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d usage rows, want %d", len(got), n)
	}
}
