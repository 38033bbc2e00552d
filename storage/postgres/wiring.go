package postgres

import (
	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// KeepAnswerIn queues rec's answer (kept for its idempotency key and its
// image) into a usage record's transaction: MoneyOptions.KeepAnswer of an
// instance's money path, so that a read and its kept answer are one
// commit.
func (db *DB) KeepAnswerIn(b *pgx.Batch, rec budget.UsageRecord) error {
	db.queueAnswers(b, rec)
	return nil
}
