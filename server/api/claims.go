package api

import (
	"context"
	"time"

	"breakwater/server/edge"
)

// AnswerClaimer holds an idempotency key while its first request is in
// flight on any of the instances that share one database (storage/postgres
// keeps the claims in a table), so that the same key sent to two
// instances at once makes one upstream call. Inside one instance
// pendingKeys does this in memory; the claimer adds the other instances.
//
// ClaimAnswer claims user's key for ttl and reports whether this instance
// won; a claim held by a crashed instance lapses after its ttl. The claim
// goes with the answer kept under the key (the read's usage transaction
// or AnswerStore.KeepAnswer, in the same statement batch), or with
// ReleaseAnswer when the request keeps nothing.
type AnswerClaimer interface {
	ClaimAnswer(ctx context.Context, user, key string, ttl time.Duration) (won bool, err error)
	ReleaseAnswer(ctx context.Context, user, key string) error
}

// answerClaimTTL is how long a claim holds a key: longer than a read
// takes once its upload is in (the claim is taken then). ocr.timeout (at
// most 90 s, the retry included) bounds the call and edge.WriteTimeout the
// handler's answer; the record may wait recordTimeout after the call. A
// claim that lapses is, in practice, a crashed instance's.
const answerClaimTTL = edge.WriteTimeout + recordTimeout

// claimTimeout bounds one claim or release statement.
const claimTimeout = 5 * time.Second

// claimKey claims r's idempotency key across instances, when the service
// runs on a shared database (Deps.Claims); one instance alone has only
// pendingKeys, and claimKey is then a no-op. Lost, the key is in flight on
// another instance, and the answer is the one pendingKeys gives inside an
// instance: 409 idempotency_key_in_use, Retry-After: 1. A claim that
// cannot be made (the database unreachable) is logged and the request
// goes on, as when the stored answers cannot be read: at worst one more
// paid call, which the money path counts and records like any.
//
// Claimed, releaseKey must be called when the request ends: it gives the
// claim back unless the request kept an answer under the key (r.kept),
// whose transaction gave it back already.
func (s *Server) claimKey(r *ocrRequest) (claimed bool, err error) {
	if s.d.Claims == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.c.Request().Context()), claimTimeout)
	defer cancel()
	won, err := s.d.Claims.ClaimAnswer(ctx, r.who.UserID, r.key, answerClaimTTL)
	switch {
	case err != nil:
		s.warnStore(keyNotClaimed, "idempotency key not claimed across instances: the request goes on", "user", r.who.UserID,
			"request_id", r.id, "err", err)
		return false, nil
	case !won:
		return false, errIdempotencyKeyInUse.WithRetryAfter(1)
	}
	return true, nil
}

// releaseKey gives back r's claim of its key unless an answer kept under
// the key gave it back. A claim that cannot be given back now (the
// database does not answer) the store gives back once it answers again,
// or it lapses after answerClaimTTL; until then a repeat of the key is
// told 409.
func (s *Server) releaseKey(r *ocrRequest) {
	if r.kept {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	if err := s.d.Claims.ReleaseAnswer(ctx, r.who.UserID, r.key); err != nil {
		s.warnStore(keyNotGivenBack, "idempotency key claim not given back now: it is once the database answers, or it lapses", "user", r.who.UserID,
			"request_id", r.id, "lapses_in", answerClaimTTL.String(), "err", err)
	}
}
