package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/limiter"
)

// TableWork is what one transaction's statements did to a table, as
// pg_stat_xact_user_tables counts it.
type TableWork struct {
	SeqScans, IndexScans, Fetched, Inserted, Updated, Deleted int64
}

// AttemptWork makes the invite check's calls of one attempt on keys at
// now, in one transaction: Begin, then Finish with a failure when it
// began, or for an attempt it refused the release of nothing that
// limiter.FailLimiter.EndRefused sends. It returns Begin's refusal and
// the work done on each table of the fail limits (a table untouched is
// absent): for the tests of the refusals' work.
func (f *Fails) AttemptWork(keys []string, cfg limiter.FailConfig, now time.Time) (*limiter.Refusal, map[string]TableWork, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		r       *limiter.Refusal
		started []string
		tripped bool
		work    = map[string]TableWork{}
	)
	err := pgx.BeginFunc(ctx, f.l.db.pool, func(tx pgx.Tx) error {
		before, err := tableWork(ctx, tx)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		f.queueBegin(b, keys, cfg, now, &r)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		b = &pgx.Batch{}
		if r == nil {
			f.queueFinish(b, keys, limiter.OutcomeFail, cfg, now, now, &started, &tripped)
		} else {
			f.queueFinish(b, keys, limiter.OutcomeRelease, cfg, time.Time{}, now, &started, &tripped)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		after, err := tableWork(ctx, tx)
		if err != nil {
			return err
		}
		for name, w := range after {
			if d := w.minus(before[name]); d != (TableWork{}) {
				work[name] = d
			}
		}
		return nil
	})
	return r, work, err
}

func (w TableWork) minus(v TableWork) TableWork {
	return TableWork{w.SeqScans - v.SeqScans, w.IndexScans - v.IndexScans, w.Fetched - v.Fetched,
		w.Inserted - v.Inserted, w.Updated - v.Updated, w.Deleted - v.Deleted}
}

// tableWork reads the fail limits' tables' counts of pg_stat_xact_user_tables:
// what tx's backend did to them since it last flushed its statistics
// (at the end of a transaction, at most once a second), so that only
// the difference of two reads in one transaction tells what was done
// between them.
func tableWork(ctx context.Context, tx pgx.Tx) (map[string]TableWork, error) {
	rows, err := tx.Query(ctx, `SELECT relname, coalesce(seq_scan, 0), coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0),
		n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables WHERE relname LIKE 'limit_fail%'`)
	if err != nil {
		return nil, err
	}
	work := map[string]TableWork{}
	var (
		name string
		w    TableWork
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &w.SeqScans, &w.IndexScans, &w.Fetched, &w.Inserted, &w.Updated, &w.Deleted}, func() error {
		work[name] = w
		return nil
	})
	return work, err
}
