package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// The answers kept with usage records (budget.Answer): by idempotency key,
// to replay a request, and by image fingerprint, to answer the same image
// again within the dedupe window, both under the user, so one user's
// answer is never another's. A read's answers are written in its usage
// transaction (QueueAnswers); KeepAnswer binds a key to an answer that
// made no read of its own.
//
// An idempotency key whose read is in flight is claimed (ClaimAnswer), so
// that the same key sent to two instances at once makes one upstream
// call: the instance that wins the claim reads; the other waits for the
// kept answer.

// QueueAnswers queues in b the statements that keep rec's answer, if
// any: by idempotency key when it has one, and by image. The usage
// record's transaction sends b, so the answer is durable exactly when the
// record is: it is MoneyOptions.KeepAnswer. It also releases this
// instance's claim of the key.
func (db *DB) QueueAnswers(b *pgx.Batch, rec budget.UsageRecord) error {
	a := rec.Answer
	if a == nil {
		return nil
	}
	if rec.UserID == "" || rec.Time.IsZero() {
		return fmt.Errorf("keep answer: %w: no user or time", ErrInvalid)
	}
	if a.IdempotencyKey != "" {
		queueKeyAnswer(b, rec.UserID, rec.Time, *a)
		b.Queue(`DELETE FROM answer_claims WHERE user_id = $1 AND key = $2 AND owner = $3`, rec.UserID, a.IdempotencyKey, db.rec.ownerID())
	}
	b.Queue(`INSERT INTO recent_reads (user_id, fingerprint, at, serials, rejected, simulated) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (user_id, fingerprint) DO UPDATE SET at = excluded.at, serials = excluded.serials,
		rejected = excluded.rejected, simulated = excluded.simulated`,
		rec.UserID, a.Fingerprint[:], rec.Time, nonNil(a.Serials), nonNil(a.Rejected), a.Simulated)
	return nil
}

func queueKeyAnswer(b *pgx.Batch, user string, at time.Time, a budget.Answer) {
	b.Queue(`INSERT INTO idempotency_answers (user_id, key, at, fingerprint, status, body) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (user_id, key) DO UPDATE SET at = excluded.at, fingerprint = excluded.fingerprint,
		status = excluded.status, body = excluded.body`,
		user, a.IdempotencyKey, at, a.Fingerprint[:], a.Status, a.Body)
}

func nonNil(list []string) []string {
	if list == nil {
		return []string{}
	}
	return list
}

// StoredAnswer returns user's answer kept under idempotency key, when its
// read was made, and whether there is one.
func (db *DB) StoredAnswer(user, key string) (budget.Answer, time.Time, bool, error) {
	ctx, cancel := opContext()
	defer cancel()
	a := budget.Answer{IdempotencyKey: key}
	var fp []byte
	var at time.Time
	err := db.pool.QueryRow(ctx, `SELECT at, fingerprint, status, body FROM idempotency_answers WHERE user_id = $1 AND key = $2`,
		user, key).Scan(&at, &fp, &a.Status, &a.Body)
	return finishAnswer(a, fp, at, err)
}

// RecentRead returns user's read of the image with fingerprint fp, when it
// was made, and whether there is one.
func (db *DB) RecentRead(user string, fp [32]byte) (budget.Answer, time.Time, bool, error) {
	ctx, cancel := opContext()
	defer cancel()
	var a budget.Answer
	var stored []byte
	var at time.Time
	err := db.pool.QueryRow(ctx, `SELECT at, fingerprint, serials, rejected, simulated FROM recent_reads WHERE user_id = $1 AND fingerprint = $2`,
		user, fp[:]).Scan(&at, &stored, &a.Serials, &a.Rejected, &a.Simulated)
	if len(a.Serials) == 0 {
		a.Serials = nil
	}
	if len(a.Rejected) == 0 {
		a.Rejected = nil
	}
	return finishAnswer(a, stored, at, err)
}

func finishAnswer(a budget.Answer, fp []byte, at time.Time, err error) (budget.Answer, time.Time, bool, error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return budget.Answer{}, time.Time{}, false, nil
	case err != nil:
		return budget.Answer{}, time.Time{}, false, fmt.Errorf("answer: %w", err)
	case len(fp) != len(a.Fingerprint):
		return budget.Answer{}, time.Time{}, false, fmt.Errorf("answer: fingerprint of %d bytes", len(fp))
	}
	if len(a.Body) == 0 {
		a.Body = nil
	}
	copy(a.Fingerprint[:], fp)
	return a, at.UTC(), true, nil
}

// KeepAnswer keeps a under user's idempotency key a.IdempotencyKey as of
// at, in a transaction of its own: the answer of a request that made no
// read (one answered from the dedupe window). It releases this instance's
// claim of the key.
func (db *DB) KeepAnswer(user string, at time.Time, a budget.Answer) error {
	if a.IdempotencyKey == "" {
		return fmt.Errorf("keep answer of %s: no idempotency key", user)
	}
	ctx, cancel := opContext()
	defer cancel()
	b := &pgx.Batch{}
	queueKeyAnswer(b, user, at, a)
	b.Queue(`DELETE FROM answer_claims WHERE user_id = $1 AND key = $2 AND owner = $3`, user, a.IdempotencyKey, db.rec.ownerID())
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
	if err != nil {
		return fmt.Errorf("keep answer of %s: %w", user, err)
	}
	return nil
}

// ClaimAnswer claims user's idempotency key for a read this instance is
// about to make, for ttl (the longest a read may take), and reports
// whether it won. It wins when no instance holds the key or the holder's
// claim has expired (a crashed instance's claim does not block the key
// for longer than ttl). The claim goes with the answer that the read's
// usage transaction or KeepAnswer keeps, or with ReleaseAnswer.
//
// A winner must look for a kept answer again before it reads: the answer
// may have been kept between its first look and its claim. A loser waits
// for the answer (StoredAnswer) or for the claim to go, and claims again.
func (db *DB) ClaimAnswer(ctx context.Context, user, key string, ttl time.Duration) (bool, error) {
	if key == "" || ttl <= 0 {
		return false, fmt.Errorf("claim answer of %s: %w: empty key or no ttl", user, ErrInvalid)
	}
	now := db.now()
	db.noteClaimTTL(ttl)
	tag, err := db.pool.Exec(ctx, `INSERT INTO answer_claims (user_id, key, owner, expires_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (user_id, key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
		WHERE answer_claims.expires_at <= $5`, user, key, db.rec.ownerID(), now.Add(ttl), now)
	if err != nil {
		if unreachable(err) {
			// The claim may have committed, its answer lost with the
			// connection (a failover): the caller goes on unclaimed,
			// and the claim, if it exists, is given back once the
			// database answers rather than left to lapse.
			db.oweClaim(user, key, now.Add(ttl))
		}
		return false, fmt.Errorf("claim answer of %s: %w", user, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseAnswer gives up this instance's claim of user's idempotency key
// (a read that failed and keeps no answer), so that a retry anywhere may
// claim it at once. Another instance's claim is left alone. When the
// database does not answer, the give-back is owed and written once it
// does (claims_owed.go); the error says so.
func (db *DB) ReleaseAnswer(ctx context.Context, user, key string) error {
	_, err := db.pool.Exec(ctx, `DELETE FROM answer_claims WHERE user_id = $1 AND key = $2 AND owner = $3`, user, key, db.rec.ownerID())
	if err != nil {
		if unreachable(err) {
			// The claim released was made before now, with the ttl of
			// the claims made: it expires by now + that ttl, and a later
			// claim of the key (a retry, once the database is back) after.
			db.oweClaim(user, key, db.now().Add(db.claimTTL()))
			return fmt.Errorf("release answer of %s (given back once the database answers): %w", user, err)
		}
		return fmt.Errorf("release answer of %s: %w", user, err)
	}
	return nil
}

// PruneAnswers deletes the answers of reads made before idempotencyBefore
// (by key) and dedupeBefore (by image), and the claims expired by then,
// and returns how many answers it deleted.
func (db *DB) PruneAnswers(idempotencyBefore, dedupeBefore time.Time) (int, error) {
	ctx, cancel := opContext()
	defer cancel()
	total := 0
	for _, q := range []struct {
		sql    string
		before time.Time
	}{
		{`DELETE FROM idempotency_answers WHERE at < $1`, idempotencyBefore},
		{`DELETE FROM recent_reads WHERE at < $1`, dedupeBefore},
	} {
		tag, err := db.pool.Exec(ctx, q.sql, q.before)
		if err != nil {
			return total, fmt.Errorf("prune answers: %w", err)
		}
		total += int(tag.RowsAffected())
	}
	if _, err := db.pool.Exec(ctx, `DELETE FROM answer_claims WHERE expires_at < $1`, db.now()); err != nil {
		return total, fmt.Errorf("prune answer claims: %w", err)
	}
	return total, nil
}

// newOwnerID names an instance in the claims it holds.
func newOwnerID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
