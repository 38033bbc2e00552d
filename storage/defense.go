package storage

import (
	"fmt"
	"sort"
	"strings"

	"go.etcd.io/bbolt"
)

// Defense state: the rate-limit windows and daily attempt counters that
// live in memory and are written behind every second, so that a restart
// neither resets a daily line nor lifts a limit. Each kind of state is a
// named sub-bucket of "defense" holding opaque values by key.

// SaveState writes entries into the named state in one plain transaction;
// a nil value deletes its key. It is not group-committed: the caller
// batches a second's worth of changes itself.
func (db *DB) SaveState(name string, entries map[string][]byte) error {
	if name == "" {
		return fmt.Errorf("%w: state without a name", ErrInvalid)
	}
	if len(entries) == 0 {
		return nil
	}
	err := db.update(func(tx *bbolt.Tx) error {
		b, err := tx.Bucket(bucketDefense).CreateBucketIfNotExists([]byte(name))
		if err != nil {
			return err
		}
		for k, v := range entries {
			if k == "" {
				continue
			}
			if v == nil {
				err = b.Delete([]byte(k))
			} else {
				err = b.Put([]byte(k), v)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save state %s: %w", name, err)
	}
	return nil
}

// LoadState returns every entry of the named state (empty if none).
func (db *DB) LoadState(name string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := db.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketDefense).Bucket([]byte(name))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load state %s: %w", name, err)
	}
	return out, nil
}

// DropStates deletes every named state that starts with prefix and sorts
// before keep (e.g. prefix "attempts/", keep "attempts/2026-11-30" drops
// earlier days).
func (db *DB) DropStates(prefix, keep string) error {
	return db.update(func(tx *bbolt.Tx) error {
		parent := tx.Bucket(bucketDefense)
		var old []string
		_ = parent.ForEachBucket(func(k []byte) error {
			if name := string(k); strings.HasPrefix(name, prefix) && name < keep {
				old = append(old, name)
			}
			return nil
		})
		sort.Strings(old)
		for _, name := range old {
			if err := parent.DeleteBucket([]byte(name)); err != nil {
				return fmt.Errorf("drop state %s: %w", name, err)
			}
		}
		return nil
	})
}
