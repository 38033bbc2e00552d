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
// back late is always safe: the statement deletes the claim only while
// this instance holds it.

const (
	claimRetry   = 250 * time.Millisecond
	claimOwedFor = 10 * time.Minute
)

// owedClaims are the claims this instance owes the database's give-back
// of, by user and key, with when each was first owed.
type owedClaims struct {
	mu      sync.Mutex
	keys    map[[2]string]time.Time
	running bool
}

// oweClaim owes the give-back of user's claim of key and starts the
// writer if it is not running.
func (db *DB) oweClaim(user, key string) {
	c := &db.claims
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[[2]string]time.Time{}
	}
	if _, ok := c.keys[[2]string{user, key}]; !ok {
		c.keys[[2]string{user, key}] = db.now()
	}
	if !c.running {
		c.running = true
		go db.giveClaimsBack()
	}
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
		now := db.now()
		for k, since := range c.keys {
			if now.Sub(since) > claimOwedFor {
				delete(c.keys, k)
				continue
			}
			users, keys = append(users, k[0]), append(keys, k[1])
		}
		if len(users) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultOpTimeout)
		_, err := db.pool.Exec(ctx, `DELETE FROM answer_claims WHERE owner = $3
			AND (user_id, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, users, keys, db.rec.ownerID())
		cancel()
		if err != nil {
			continue
		}
		c.mu.Lock()
		for i := range users {
			delete(c.keys, [2]string{users[i], keys[i]})
		}
		c.mu.Unlock()
		db.log.Info("postgres: idempotency key claims given back once the database answered", "claims", len(users))
	}
}
