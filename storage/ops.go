package storage

import (
	"fmt"
	"io"

	"go.etcd.io/bbolt"
)

// Operator flags are switches an operator sets that must survive a
// restart, such as the manual budget brake. They live in the meta bucket
// under "flag:" + name.

// SetFlag stores a named switch in one plain transaction.
func (db *DB) SetFlag(name string, on bool) error {
	v := []byte{0}
	if on {
		v[0] = 1
	}
	err := db.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("flag:"+name), v)
	})
	if err != nil {
		return fmt.Errorf("set flag %s: %w", name, err)
	}
	return nil
}

// Flag reads a named switch; one never set is off.
func (db *DB) Flag(name string) (bool, error) {
	var on bool
	err := db.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get([]byte("flag:" + name))
		on = len(v) == 1 && v[0] == 1
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("flag %s: %w", name, err)
	}
	return on, nil
}

// Backup writes a consistent copy of the whole database to w from one read
// transaction, while writers go on. It returns the bytes written.
func (db *DB) Backup(w io.Writer) (int64, error) {
	var n int64
	err := db.view(func(tx *bbolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}
