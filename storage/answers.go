package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
)

// The answers kept with usage records (budget.Answer): by idempotency key,
// to replay a request, and by image fingerprint, to answer the same image
// again within the dedupe window. Both are keyed under the user, so one
// user's answer is never another's.
//
//	idempotency:  user id, 0, key         -> storedAnswer
//	recent_reads: user id, 0, fingerprint -> storedAnswer
//
// Since schema version 4 a stored answer is binary (answerRowV1 and the
// fields in appendAnswerRow's order); rows written before are JSON, start
// with '{', and are still read.

// storedAnswer is a budget.Answer with the time of its read.
type storedAnswer struct {
	At          time.Time `json:"at"`
	Fingerprint []byte    `json:"fp"`
	Status      int       `json:"status,omitempty"`
	Body        []byte    `json:"body,omitempty"`
	Serials     []string  `json:"serials,omitempty"`
	Rejected    []string  `json:"rejected,omitempty"`
	Simulated   bool      `json:"simulated,omitempty"`
}

func userKey(user string, rest []byte) []byte {
	k := make([]byte, 0, len(user)+1+len(rest))
	k = append(k, user...)
	k = append(k, 0)
	return append(k, rest...)
}

// answerRows are the rows that keep rec's answer (budget.Answer), encoded
// before the write reaches the writer.
type answerRows struct {
	byKey, byKeyRow   []byte // idempotency; nil without a key
	byImage, imageRow []byte // recent_reads; nil without an answer
}

// encodeAnswers encodes rec's answer, if any, for the usage record's own
// transaction: by idempotency key when it has one, and by image.
func encodeAnswers(rec budget.UsageRecord) (answerRows, error) {
	a := rec.Answer
	if a == nil {
		return answerRows{}, nil
	}
	var rows answerRows
	if a.IdempotencyKey != "" {
		v := storedAnswer{At: rec.Time, Fingerprint: a.Fingerprint[:], Status: a.Status, Body: a.Body}
		rows.byKey = userKey(rec.UserID, []byte(a.IdempotencyKey))
		rows.byKeyRow = appendAnswerRow(nil, v)
	}
	v := storedAnswer{At: rec.Time, Fingerprint: a.Fingerprint[:], Serials: a.Serials, Rejected: a.Rejected, Simulated: a.Simulated}
	rows.byImage = userKey(rec.UserID, a.Fingerprint[:])
	rows.imageRow = appendAnswerRow(nil, v)
	return rows, nil
}

// put writes the rows in tx.
func (r answerRows) put(tx *bbolt.Tx) error {
	if r.byKey != nil {
		if err := tx.Bucket(bucketIdempotency).Put(r.byKey, r.byKeyRow); err != nil {
			return fmt.Errorf("put answer %s: %w", r.byKey, err)
		}
	}
	if r.byImage != nil {
		if err := tx.Bucket(bucketRecentReads).Put(r.byImage, r.imageRow); err != nil {
			return fmt.Errorf("put answer %x: %w", r.byImage, err)
		}
	}
	return nil
}

// StoredAnswer returns user's answer kept under idempotency key, when its
// read was made, and whether there is one.
func (db *DB) StoredAnswer(user, key string) (budget.Answer, time.Time, bool, error) {
	return db.answer(bucketIdempotency, userKey(user, []byte(key)), key)
}

// RecentRead returns user's read of the image with fingerprint fp, when it
// was made, and whether there is one.
func (db *DB) RecentRead(user string, fp [32]byte) (budget.Answer, time.Time, bool, error) {
	return db.answer(bucketRecentReads, userKey(user, fp[:]), "")
}

// KeepAnswer keeps a under user's idempotency key a.IdempotencyKey as of
// at, in a transaction of its own: the answer of a request that made no
// read (one answered from the dedupe window), which binds its key to its
// image as a read's usage transaction does.
func (db *DB) KeepAnswer(user string, at time.Time, a budget.Answer) error {
	if a.IdempotencyKey == "" {
		return fmt.Errorf("keep answer of %s: no idempotency key", user)
	}
	k := userKey(user, []byte(a.IdempotencyKey))
	row := appendAnswerRow(nil, storedAnswer{At: at, Fingerprint: a.Fingerprint[:], Status: a.Status, Body: a.Body})
	err := db.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdempotency).Put(k, row)
	})
	if err != nil {
		return fmt.Errorf("keep answer of %s: %w", user, err)
	}
	return nil
}

func (db *DB) answer(bucket, key []byte, idemKey string) (budget.Answer, time.Time, bool, error) {
	var v storedAnswer
	var found bool
	err := db.view(func(tx *bbolt.Tx) (err error) {
		row := tx.Bucket(bucket).Get(key)
		if found = row != nil; found {
			v, err = decodeAnswerRow(row)
		}
		return err
	})
	if err != nil || !found {
		if err != nil {
			err = fmt.Errorf("answer: %w", err)
		}
		return budget.Answer{}, time.Time{}, false, err
	}
	a := budget.Answer{IdempotencyKey: idemKey, Status: v.Status, Body: v.Body, Serials: v.Serials, Rejected: v.Rejected, Simulated: v.Simulated}
	copy(a.Fingerprint[:], v.Fingerprint)
	return a, v.At, true, nil
}

// PruneAnswers deletes the answers of reads made before idempotencyBefore
// (by key) and dedupeBefore (by image), a bounded number per transaction,
// and returns how many it deleted.
func (db *DB) PruneAnswers(idempotencyBefore, dedupeBefore time.Time) (int, error) {
	total := 0
	for _, b := range []struct {
		bucket []byte
		before time.Time
	}{{bucketIdempotency, idempotencyBefore}, {bucketRecentReads, dedupeBefore}} {
		for {
			n, err := db.pruneAnswers(b.bucket, b.before)
			total += n
			if err != nil {
				return total, err
			}
			if n < pruneBatch {
				break
			}
		}
	}
	return total, nil
}

// pruneBatch is the most answers one pruning transaction deletes.
const pruneBatch = 4096

func (db *DB) pruneAnswers(bucket []byte, before time.Time) (int, error) {
	n := 0
	err := db.update(func(tx *bbolt.Tx) error {
		n = 0
		b := tx.Bucket(bucket)
		var old [][]byte
		c := b.Cursor()
		for k, v := c.First(); k != nil && len(old) < pruneBatch; k, v = c.Next() {
			if at, err := answerTime(v); err != nil || at.Before(before) {
				old = append(old, bytes.Clone(k))
			}
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(old)
		return nil
	})
	return n, err
}

// answerRowV1 is the format byte of a binary stored answer.
const answerRowV1 = 0x01

// appendAnswerRow appends a's binary row to b: At (varint UnixNano), the
// 32-byte fingerprint, Status (uvarint), Body, then Serials and Rejected
// (a uvarint count and each string), then Simulated (one byte).
func appendAnswerRow(b []byte, a storedAnswer) []byte {
	b = append(b, answerRowV1)
	b = binary.AppendVarint(b, a.At.UnixNano())
	b = append(b, a.Fingerprint...)
	b = binary.AppendUvarint(b, uint64(a.Status))
	b = appendText(b, a.Body)
	for _, list := range [...][]string{a.Serials, a.Rejected} {
		b = binary.AppendUvarint(b, uint64(len(list)))
		for _, s := range list {
			b = appendText(b, s)
		}
	}
	if a.Simulated {
		return append(b, 1)
	}
	return append(b, 0)
}

// decodeAnswerRow decodes a stored answer of either form.
func decodeAnswerRow(row []byte) (storedAnswer, error) {
	return decodeRow(row, answerRowV1, func(d *rowDecoder, a *storedAnswer) {
		a.At = time.Unix(0, d.varint()).UTC()
		a.Fingerprint = d.fixed(32)
		if st := d.uvarint(); st > 999 {
			d.fail("status %d", st)
		} else {
			a.Status = int(st)
		}
		if body := d.string(); body != "" {
			a.Body = []byte(body)
		}
		a.Serials, a.Rejected = d.strings(), d.strings()
		switch flag := d.fixed(1); {
		case flag == nil:
		case flag[0] <= 1:
			a.Simulated = flag[0] == 1
		default:
			d.fail("simulated flag %d", flag[0])
		}
	})
}

// answerTime is the time of a stored answer's read, without decoding the
// rest of a binary row.
func answerTime(row []byte) (time.Time, error) {
	if len(row) > 0 && row[0] == answerRowV1 {
		d := rowDecoder{rest: row[1:]}
		at := time.Unix(0, d.varint())
		return at, d.err
	}
	a, err := decodeAnswerRow(row)
	return a.At, err
}
