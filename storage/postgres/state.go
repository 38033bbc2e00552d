package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The write-behind of the layers' memory (limiter windows, attempt
// counts, cooldowns): opaque values by state name and key. Each instance
// writes its own layers' state under the names its layers give; until the
// layers themselves are shared, two instances writing one name overwrite
// each other's entries key by key, as the last write wins.

// SaveState writes entries over the named state's, in one transaction: a
// nil value deletes its key, an empty key is skipped.
func (db *DB) SaveState(name string, entries map[string][]byte) error {
	if name == "" {
		return fmt.Errorf("%w: state without a name", ErrInvalid)
	}
	var putKeys, putValues, dropKeys [][]byte
	for k, v := range entries {
		switch {
		case k == "":
		case v == nil:
			dropKeys = append(dropKeys, []byte(k))
		default:
			putKeys, putValues = append(putKeys, []byte(k)), append(putValues, v)
		}
	}
	if len(putKeys) == 0 && len(dropKeys) == 0 {
		return nil
	}
	ctx, cancel := opContext()
	defer cancel()
	b := &pgx.Batch{}
	if len(dropKeys) > 0 {
		b.Queue(`DELETE FROM layer_state WHERE name = $1 AND key = ANY($2)`, name, dropKeys)
	}
	if len(putKeys) > 0 {
		b.Queue(`INSERT INTO layer_state (name, key, value) SELECT $1, k, v FROM unnest($2::bytea[], $3::bytea[]) AS e(k, v)
			ON CONFLICT (name, key) DO UPDATE SET value = excluded.value`, name, putKeys, putValues)
	}
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
	if err != nil {
		return fmt.Errorf("save state %s: %w", name, err)
	}
	return nil
}

// LoadState returns every entry of the named state (empty if none).
func (db *DB) LoadState(name string) (map[string][]byte, error) {
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT key, value FROM layer_state WHERE name = $1`, name)
	if err != nil {
		return nil, fmt.Errorf("load state %s: %w", name, err)
	}
	defer rows.Close()
	out := map[string][]byte{}
	for rows.Next() {
		var k, v []byte
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("load state %s: %w", name, err)
		}
		out[string(k)] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load state %s: %w", name, err)
	}
	return out, nil
}

// DropStates deletes every named state that starts with prefix and sorts
// before keep (e.g. prefix "attempts/", keep "attempts/2026-11-30" drops
// earlier days).
func (db *DB) DropStates(prefix, keep string) error {
	ctx, cancel := opContext()
	defer cancel()
	_, err := db.pool.Exec(ctx, `DELETE FROM layer_state WHERE starts_with(name, $1) AND name COLLATE "C" < $2`, prefix, keep)
	if err != nil {
		return fmt.Errorf("drop states %s before %s: %w", prefix, keep, err)
	}
	return nil
}
