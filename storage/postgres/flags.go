package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Operator flags are switches an operator sets that must survive a
// restart and hold on every instance, such as the manual budget brake.
// Setting one notifies KindFlag in the same transaction.

// SetFlag stores a named switch and notifies it.
func (db *DB) SetFlag(name string, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	ctx, cancel := opContext()
	defer cancel()
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO flags (name, value, updated_at) VALUES ($1, $2, now())
			ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`, name, v); err != nil {
			return err
		}
		return notifyTx(ctx, tx, KindFlag, name)
	})
	if err != nil {
		return fmt.Errorf("set flag %s: %w", name, err)
	}
	return nil
}

// Flag reads a named switch; one never set is off.
func (db *DB) Flag(name string) (bool, error) {
	ctx, cancel := opContext()
	defer cancel()
	var v string
	err := db.pool.QueryRow(ctx, `SELECT value FROM flags WHERE name = $1`, name).Scan(&v)
	switch {
	case err == pgx.ErrNoRows:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("flag %s: %w", name, err)
	}
	return v == "1", nil
}
