package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// KeepReadAnswer keeps rec's answer in a transaction of its own, as the
// usage record's transaction does with queueAnswers: for the tests of
// package postgres_test.
func (db *DB) KeepReadAnswer(ctx context.Context, rec budget.UsageRecord) error {
	b := &pgx.Batch{}
	db.queueAnswers(b, rec)
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
}

// CountCommit counts a usage writer's commit, as the writer does.
func (db *DB) CountCommit(writes int) { db.countCommit(writes) }
