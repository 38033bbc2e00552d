package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/limiter"
)

// KeepReadAnswer keeps rec's answer in a transaction of its own, as the
// usage record's transaction does with QueueAnswers: for the tests of
// package postgres_test.
func (db *DB) KeepReadAnswer(ctx context.Context, rec budget.UsageRecord) error {
	b := &pgx.Batch{}
	if err := db.QueueAnswers(b, rec); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
}

// TakeTogether makes n attempts of user in one group transaction, as n
// callers arriving together would, and returns how many were taken and
// the count each taken one saw: for the tests of merged takes.
func (a *Attempts) TakeTogether(user string, line int64, n int, now time.Time) (taken int, counts []int64, err error) {
	op := &groupOp{}
	oks := make([]bool, n)
	counts = make([]int64, n)
	day := a.m.cal.Day(now)
	for i := range n {
		op.steps = append(op.steps, step{rank: rankUser, key: userKey(user, userAttempt, day),
			row: &rowStep{kind: rowAttempt, user: user, period: day, bound: line, taken: &oks[i], value: &counts[i]}})
	}
	if err := a.m.do(context.Background(), op); err != nil {
		return 0, nil, err
	}
	for _, ok := range oks {
		if ok {
			taken++
		}
	}
	return taken, counts, nil
}

// ReserveTogether reserves n slots of user's quota in one group
// transaction, and returns how many were held.
func (q *Quotas) ReserveTogether(user string, limit int64, n int, now time.Time) (held int, err error) {
	op := &groupOp{}
	oks := make([]bool, n)
	for i := range n {
		sub, _ := q.reserveOp(user, limit, now)
		sub.steps[1].row.taken = &oks[i]
		op.steps = append(op.steps, sub.steps...)
	}
	if err := q.m.do(context.Background(), op); err != nil {
		return 0, err
	}
	for _, ok := range oks {
		if ok {
			held++
		}
	}
	return held, nil
}

// DecideTogether decides one request of each key under cfg in one batch,
// as callers arriving together would: for the test of a batch the server
// refuses a statement of.
func (w *Windows) DecideTogether(keys []string, cfg limiter.Config, now time.Time) ([]*limiter.Refusal, []error) {
	calls := make([]*windowCall, len(keys))
	for i, k := range keys {
		calls[i] = &windowCall{name: w.name, key: k, cfg: cfg, now: now, done: make(chan struct{})}
	}
	w.l.sendBatch(append([]*windowCall(nil), calls...)) // it sorts what it is given
	refusals, errs := make([]*limiter.Refusal, len(keys)), make([]error, len(keys))
	for i, c := range calls {
		refusals[i], errs[i] = c.refusal, c.err
	}
	return refusals, errs
}

// AdmitResult is one admission's answer, as TakeAndReserve gives it.
type AdmitResult struct {
	Refused       *limiter.Refusal
	Take, Reserve error
}

// AdmitTogether admits n requests of user (1ns apart from now) in one
// group transaction, as n callers arriving together would: for the tests
// of merged admissions.
func (q *Quotas) AdmitTogether(user string, window limiter.Joined, n int, line, limit int64, now time.Time) ([]AdmitResult, error) {
	m := q.m
	op := &groupOp{}
	steps := make([]*admitStep, n)
	for i := range n {
		at := now.Add(time.Duration(i))
		steps[i] = &admitStep{user: user, now: at, limits: admitLimits{window: window.Store.(*Windows).name, cfg: window.Config,
			stopRate: window.Enforce, day: m.cal.Day(at), line: line, stopLine: true, month: m.cal.Month(at), limit: limit, owner: m.owner}}
		op.steps = append(op.steps, step{rank: rankUser, key: userKey(user, userAdmit, ""), admit: steps[i]})
	}
	if err := m.do(context.Background(), op); err != nil {
		return nil, err
	}
	out := make([]AdmitResult, n)
	for i, s := range steps {
		_, out[i].Refused, out[i].Take, out[i].Reserve = s.answer(m)
	}
	return out, nil
}
