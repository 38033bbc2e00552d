package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
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
