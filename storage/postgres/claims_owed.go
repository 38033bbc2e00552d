package postgres

import (
	"context"
	"sync"
	"time"
)

// A claim of an idempotency key (ClaimAnswer) whose give-back fails
// because the database does not answer (stopped, failing over) would
// hold the key until it lapses (server/api's answerClaimTTL, minutes):
// the client's retry of a read that failed meanwhile would be told 409
// all that time. So the give-back is owed and written once the database
// answers again, tried every claimRetry for at most claimOwedFor. Giving
// back late is safe: the statement deletes the claim only while this
// instance holds it, and only a claim made by then (its expiry no later
// than the owed claim's could be): a retry of the key that claims it anew
// once the database is back, and reads, keeps its claim.

const (
	claimRetry   = 250 * time.Millisecond
	claimOwedFor = 10 * time.Minute
)

// owedClaims are the claims this instance owes the database's give-back
// of, by user and key.
type owedClaims struct {
	mu      sync.Mutex
	keys    map[[2]string]owedClaim
	running bool
	ttl     time.Duration // the ttl of the last claim made (ClaimAnswer)
}

// owedClaim is one owed give-back: when it was first owed, and the latest
// expiry the claim owed can have.
type owedClaim struct {
	since, upTo time.Time
}

// oweClaim owes the give-back of user's claim of key, one expiring at
// upTo at the latest, and starts the writer if it is not running.
func (db *DB) oweClaim(user, key string, upTo time.Time) {
	c := &db.claims
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[[2]string]owedClaim{}
	}
	k := [2]string{user, key}
	o, ok := c.keys[k]
	if !ok {
		o.since = db.now()
	}
	if upTo.After(o.upTo) {
		o.upTo = upTo
	}
	c.keys[k] = o
	if !c.running {
		c.running = true
		go db.giveClaimsBack()
	}
}

// noteClaimTTL keeps the ttl of the claims made, for the bound of a
// release owed (ReleaseAnswer does not know its claim's expiry).
func (db *DB) noteClaimTTL(ttl time.Duration) {
	db.claims.mu.Lock()
	db.claims.ttl = ttl
	db.claims.mu.Unlock()
}

// claimTTL is the ttl of the last claim made.
func (db *DB) claimTTL() time.Duration {
	db.claims.mu.Lock()
	defer db.claims.mu.Unlock()
	return db.claims.ttl
}

// giveClaimsBack writes the owed give-backs, in one statement, every
// claimRetry until none is owed (or the database is closed); one owed for
// longer than claimOwedFor has lapsed and is dropped.
func (db *DB) giveClaimsBack() {
	c := &db.claims
	for {
		select {
		case <-db.closed:
			return
		case <-time.After(claimRetry):
		}
		c.mu.Lock()
		var users, keys []string
		var upTo []time.Time
		now := db.now()
		for k, o := range c.keys {
			if now.Sub(o.since) > claimOwedFor {
				delete(c.keys, k)
				continue
			}
			users, keys, upTo = append(users, k[0]), append(keys, k[1]), append(upTo, o.upTo)
		}
		if len(users) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultOpTimeout)
		_, err := db.pool.Exec(ctx, `DELETE FROM answer_claims c USING unnest($1::text[], $2::text[], $4::timestamptz[]) AS o (user_id, key, up_to)
			WHERE c.owner = $3 AND c.user_id = o.user_id AND c.key = o.key AND c.expires_at <= o.up_to`, users, keys, db.rec.ownerID(), upTo)
		cancel()
		if err != nil {
			continue
		}
		c.mu.Lock()
		for i := range users {
			if k := [2]string{users[i], keys[i]}; c.keys[k].upTo.Equal(upTo[i]) { // not owed again meanwhile
				delete(c.keys, k)
			}
		}
		c.mu.Unlock()
		db.log.Info("postgres: idempotency key claims given back once the database answered", "claims", len(users))
	}
}
