package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
)

// validUsage reports the first field of r that storage cannot accept.
func validUsage(r budget.UsageRecord) error {
	if r.UserID == "" {
		return fmt.Errorf("%w: usage record without user id", ErrInvalid)
	}
	if err := checkKeyTime(r.Time); err != nil {
		return fmt.Errorf("usage record of %s: %w", r.UserID, err)
	}
	return nil
}

// RecordUsage commits, in one durable transaction shared with concurrent
// callers (group commit), the increment of quota[month][rec.UserID] by one
// and the usage row, and settles the read's budget reservation (a zero
// Settlement settles nothing; one with ID 0 and a Day adds the call to that
// day's budget). It returns only once the transaction is on
// disk (or failed); on error nothing of rec was written. month is "2006-01".
//
// ctx bounds only the wait to enqueue; once queued, RecordUsage waits for
// the outcome, because the caller must know the record's fate. After Close
// it returns ErrClosed.
func (db *DB) RecordUsage(ctx context.Context, month string, rec budget.UsageRecord, s budget.Settlement) error {
	row, err := encodeUsage(month, rec)
	if err != nil {
		return err
	}
	answers, err := encodeAnswers(rec)
	if err != nil {
		return err
	}
	return db.commit(ctx, func(tx *bbolt.Tx) error {
		if err := putUsage(tx, month, rec.UserID, rec.Time, row); err != nil {
			return err
		}
		if err := answers.put(tx); err != nil {
			return err
		}
		return settle(tx, s)
	})
}

// encodeUsage checks rec and encodes its usage row. Encoding is done on
// the caller's goroutine: the writer, which every durable write waits for,
// only puts bytes.
func encodeUsage(month string, rec budget.UsageRecord) ([]byte, error) {
	if err := checkMonth(month); err != nil {
		return nil, err
	}
	if err := validUsage(rec); err != nil {
		return nil, err
	}
	return appendUsageRow(make([]byte, 0, 64+len(rec.UserID)+len(rec.KeyID)+len(rec.RequestID)+len(rec.Model)), rec), nil
}

// recordUsage is the quota increment and usage row of rec, in tx.
func recordUsage(tx *bbolt.Tx, month string, rec budget.UsageRecord) error {
	row, err := encodeUsage(month, rec)
	if err != nil {
		return err
	}
	return putUsage(tx, month, rec.UserID, rec.Time, row)
}

// putUsage adds one to user's quota of month and appends the usage row
// made at t. It is pure with respect to tx, as commit requires.
func putUsage(tx *bbolt.Tx, month, user string, t time.Time, row []byte) error {
	quota, err := tx.Bucket(bucketQuota).CreateBucketIfNotExists([]byte(month))
	if err != nil {
		return fmt.Errorf("quota %s: %w", month, err)
	}
	var used uint64
	if v := quota.Get([]byte(user)); len(v) == 8 {
		used = binary.BigEndian.Uint64(v)
	}
	if err := quota.Put([]byte(user), encodeUint64(used+1)); err != nil {
		return fmt.Errorf("quota %s of %s: %w", month, user, err)
	}

	usage := tx.Bucket(bucketUsage)
	usage.FillPercent = appendOnlyFill
	seq, err := usage.NextSequence()
	if err != nil {
		return fmt.Errorf("usage sequence: %w", err)
	}
	if err := usage.Put(timeKey(t, seq), row); err != nil {
		return fmt.Errorf("usage row of %s: %w", user, err)
	}
	return nil
}

// QuotaUsed returns, for month ("2006-01"), each user's count of successful
// reads. Users with no read that month are absent.
func (db *DB) QuotaUsed(month string) (map[string]int64, error) {
	if err := checkMonth(month); err != nil {
		return nil, fmt.Errorf("quota used: %w", err)
	}
	used := make(map[string]int64)
	err := db.view(func(tx *bbolt.Tx) error {
		quota := tx.Bucket(bucketQuota).Bucket([]byte(month))
		if quota == nil {
			return nil
		}
		return quota.ForEach(func(user, v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("quota of %s: value of %d bytes", user, len(v))
			}
			used[string(user)] = int64(binary.BigEndian.Uint64(v))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("quota used %s: %w", month, err)
	}
	return used, nil
}

// Usage returns the usage records with from <= Time < to, in time order
// (records with equal times in the order they were written). A zero from
// means from the first record; a zero to means up to the last.
func (db *DB) Usage(from, to time.Time) ([]budget.UsageRecord, error) {
	var recs []budget.UsageRecord
	err := db.view(func(tx *bbolt.Tx) error {
		return scanRange(tx.Bucket(bucketUsage), from, to, func(k, v []byte) error {
			r, err := decodeUsageRow(v)
			if err != nil {
				return fmt.Errorf("usage row %x: %w", k, err)
			}
			recs = append(recs, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return recs, nil
}

// scanRange calls fn for each timeKey-keyed row of b with from <= t < to,
// in key order. fn must copy what it keeps.
func scanRange(b *bbolt.Bucket, from, to time.Time, fn func(k, v []byte) error) error {
	lo, hi := rangeKeys(from, to)
	c := b.Cursor()
	for k, v := c.Seek(lo); k != nil; k, v = c.Next() {
		if hi != nil && bytes.Compare(k, hi) >= 0 {
			break
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}
