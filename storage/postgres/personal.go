package postgres

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/detect"
)

var _ detect.PersonalPruner = (*DB)(nil)

// PrunePersonal deletes the personal data that outlives the raw
// statistics events, once it is past retention: days before beforeDay
// lose their findings and the per-IP and per-e-mail figures of their
// aggregates (the per-user figures and the service's stay), and an invite
// that can no longer be redeemed at now (revoked, expired or used up)
// loses the e-mails that redeemed it before before. An invite that can
// still be redeemed keeps its e-mails: they are what stops one e-mail from
// taking two uses. It returns how many records it changed or deleted (an
// aggregate, a day of findings, a redemption each), in one transaction.
func (db *DB) PrunePersonal(beforeDay string, before, now time.Time) (int, error) {
	if err := checkDay(beforeDay); err != nil {
		return 0, fmt.Errorf("prune personal data: %w", err)
	}
	ctx, cancel := opContext()
	defer cancel()
	n := 0
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		n = 0
		tag, err := tx.Exec(ctx, `UPDATE day_stats SET stats = jsonb_set(stats - 'emails', '{ips}', 'null')
			WHERE day < $1 AND (jsonb_typeof(stats->'ips') = 'object' OR stats ? 'emails')`, beforeDay)
		if err != nil {
			return err
		}
		n += int(tag.RowsAffected())
		var days int
		if err := tx.QueryRow(ctx, `WITH gone AS (DELETE FROM findings WHERE day < $1 RETURNING day)
			SELECT count(DISTINCT day) FROM gone`, beforeDay).Scan(&days); err != nil {
			return err
		}
		n += days
		tag, err = tx.Exec(ctx, `DELETE FROM invite_redemptions r USING invites i
			WHERE r.hash = i.hash AND r.at < $1
			AND (i.revoked_at IS NOT NULL OR i.expires_at <= $2 OR i.used >= i.max_uses)`, before, now)
		if err != nil {
			return err
		}
		n += int(tag.RowsAffected())
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune personal data: %w", err)
	}
	return n, nil
}
