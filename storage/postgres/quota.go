package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// Plan quotas (layer 2b), exact across instances. quota_counts holds each
// user's recorded reads per month; quota_holds the reads in flight, per
// user, month and instance. Reserve takes a slot only if used plus every
// live instance's holds stays under the limit: in one group transaction it
// first locks the user's quota_counts row (an upsert), then, in a later
// statement (a new snapshot, taken after the lock is ours, so it sees
// every other instance's committed holds), adds a hold only under the
// limit. Every writer that adds to a user's holds or used count holds
// that lock first: the usage record turns the hold into a used read in
// one transaction (quota_counts +1, the hold -1). Release only drops a
// hold; a reservation that reads the hold before the drop commits refuses
// when it need not, never the other way round.
//
// A crashed instance's holds must not keep slots forever. They expire by
// owner and heartbeat, not one by one: each instance says it is alive in
// money_owners every HoldHeartbeat, and a hold counts only while its owner
// was seen within HoldTTL (by the reserving request's clock). A hold of its
// own needs no expiry, however long its read takes, as long as the instance
// lives.

// Quotas is guard.Quotas on the shared database. Check answers from what
// this instance has seen (Reserve decides); Reserve, and the usage record,
// write.
type Quotas struct{ m *Money }

// Quotas returns the plan quotas of this instance.
func (m *Money) Quotas() *Quotas { return &Quotas{m: m} }

// quotaCache is what this instance knows of the quotas in the current
// month: users' recorded reads as last read or written, and its own holds.
type quotaCache struct {
	mu       sync.Mutex
	month    string
	used     map[string]int64
	inFlight map[string]int64
}

// at moves the cache to month (months only move forward) and returns
// whether month is the cache's month. c.mu is held.
func (c *quotaCache) at(month string) bool {
	if month > c.month {
		c.month, c.used, c.inFlight = month, map[string]int64{}, map[string]int64{}
	}
	return month == c.month
}

func (c *quotaCache) setUsed(user, month string, used int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at(month) {
		c.used[user] = used
	}
}

func (c *quotaCache) addInFlight(user, month string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at(month) {
		if c.inFlight[user] += n; c.inFlight[user] <= 0 {
			delete(c.inFlight, user)
		}
	}
}

// Check refuses, as Reserve would, a user this instance knows to have no
// read left; Reserve decides.
func (q *Quotas) Check(user string, limit int64, now time.Time) error {
	c := &q.m.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at(q.m.cal.Month(now))
	if c.used[user]+c.inFlight[user] >= limit {
		return quotaError(limit, now, q.m.loc)
	}
	return nil
}

// Reserve holds one read of user's monthly quota of limit, or refuses with
// a *budget.QuotaError when the recorded reads and every live instance's
// holds reach it. It fails (closed) when the database cannot answer.
func (q *Quotas) Reserve(user string, limit int64, now time.Time) (budget.Slot, error) {
	m := q.m
	if limit <= 0 {
		return budget.Slot{}, quotaError(limit, now, m.loc)
	}
	op, done := q.reserveOp(user, limit, now)
	ctx, cancel := m.ctx()
	defer cancel()
	if err := m.do(ctx, op); err != nil {
		return budget.Slot{}, fmt.Errorf("postgres: reserve a quota slot: %w", err)
	}
	return done()
}

// reserveOp is Reserve's write (limit > 0), and what Reserve answers once
// it is committed.
func (q *Quotas) reserveOp(user string, limit int64, now time.Time) (*groupOp, func() (budget.Slot, error)) {
	m := q.m
	month := m.cal.Month(now)
	var (
		used int64
		held bool
	)
	op := &groupOp{what: "quota reservation", reset: func() { used, held = 0, false }, steps: []step{
		{rank: rankUser, key: userKey(user, userQuota, month), row: &rowStep{kind: rowQuota, user: user, period: month, value: &used}},
		{rank: rankUser, key: userKey(user, userHolds, month) + holdTake, row: &rowStep{kind: rowHoldTake, user: user, period: month, owner: m.owner,
			alive: now.Add(-HoldTTL), bound: limit, taken: &held}},
	}}
	return op, func() (budget.Slot, error) {
		m.cache.setUsed(user, month, used)
		if !held {
			return budget.Slot{}, quotaError(limit, now, m.loc)
		}
		m.cache.addInFlight(user, month, 1)
		return budget.Slot{User: user, Month: month, Limit: limit}, nil
	}
}

// SharesCommit reports whether attempts is this instance's daily line
// (Money.Attempts): TakeAndReserve (admit.go) then serves for both.
func (q *Quotas) SharesCommit(attempts any) bool {
	a, ok := attempts.(*Attempts)
	return ok && a.m == q.m
}

// Hold steps of one user and month touch one row (this instance's), in
// the order of these key suffixes: the holds that end (a usage record, a
// release) before those taken, so that a reservation in the same group as
// a record of the same user does not count that read twice (used, and
// still held).
const (
	holdEnd  = "\x000"
	holdTake = "\x001"
)

// scanTaken reads a conditional write's RETURNING: a row means it was
// taken, none that its condition refused.
func scanTaken(row pgx.Row, n *int64, taken *bool) error {
	err := row.Scan(n)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	*taken = err == nil
	return err
}

// Confirm ends the hold of a read whose usage record is committed (the
// record moved it into quota_counts) and returns the user's reads used in
// the slot's month, as the record left them.
func (q *Quotas) Confirm(s budget.Slot) (used int64) {
	c := &q.m.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at(s.Month) {
		return 0
	}
	if c.inFlight[s.User]--; c.inFlight[s.User] <= 0 {
		delete(c.inFlight, s.User)
	}
	return c.used[s.User]
}

// Release gives back the hold of a read that did not succeed. The write is
// not waited for: if it fails, the hold is given back with a later
// heartbeat, and counts (the safe side) until then.
func (q *Quotas) Release(s budget.Slot) {
	if s.User == "" {
		return
	}
	q.m.cache.addInFlight(s.User, s.Month, -1)
	q.m.releases.add(s.User, s.Month, 1)
	go q.m.retryReleases()
}

// Used returns user's recorded reads in the month holding now, from the
// database when this instance has not seen the user this month (0 if it
// cannot answer).
func (q *Quotas) Used(user string, now time.Time) int64 {
	m := q.m
	month := m.cal.Month(now)
	c := &m.cache
	c.mu.Lock()
	var (
		used int64
		seen bool
	)
	if c.at(month) {
		used, seen = c.used[user]
	}
	c.mu.Unlock()
	if seen {
		return used
	}
	ctx, cancel := m.ctx()
	defer cancel()
	used, err := m.recordedUsed(ctx, user, month)
	if err != nil {
		return 0
	}
	return used
}

// Recorded is the plan quotas as the operator reads them: each user's
// recorded reads from quota_counts, every instance's, at each call (the
// cache behind Used holds what this instance has seen).
func (q *Quotas) Recorded() RecordedQuotas { return RecordedQuotas{m: q.m} }

// RecordedQuotas reads the users' recorded reads from the database.
type RecordedQuotas struct{ m *Money }

// Used returns user's recorded reads in the month holding now, read from
// the database; if it cannot answer, what this instance last saw.
func (r RecordedQuotas) Used(user string, now time.Time) int64 {
	m := r.m
	month := m.cal.Month(now)
	ctx, cancel := m.ctx()
	defer cancel()
	used, err := m.recordedUsed(ctx, user, month)
	if err != nil {
		return m.Quotas().Used(user, now)
	}
	return used
}

// recordedUsed reads user's recorded reads in month from the database,
// and notes them in the cache.
func (m *Money) recordedUsed(ctx context.Context, user, month string) (int64, error) {
	var used int64
	if err := m.db.pool.QueryRow(ctx, "SELECT coalesce(max(used), 0) FROM quota_counts WHERE user_id = $1 AND month = $2", user, month).Scan(&used); err != nil {
		return 0, err
	}
	m.cache.setUsed(user, month, used)
	return used, nil
}

// QuotaUsed returns each user's recorded reads in month ("2006-01"); users
// without one are absent.
func (m *Money) QuotaUsed(ctx context.Context, month string) (map[string]int64, error) {
	rows, err := m.db.pool.Query(ctx, "SELECT user_id, used FROM quota_counts WHERE month = $1 AND used > 0", month)
	if err != nil {
		return nil, fmt.Errorf("postgres: quota used %s: %w", month, err)
	}
	used := map[string]int64{}
	var (
		user string
		n    int64
	)
	_, err = pgx.ForEachRow(rows, []any{&user, &n}, func() error { used[user] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("postgres: quota used %s: %w", month, err)
	}
	return used, nil
}

func quotaError(limit int64, now time.Time, loc *time.Location) *budget.QuotaError {
	l := now.In(loc)
	next := time.Date(l.Year(), l.Month()+1, 1, 0, 0, 0, 0, loc)
	return &budget.QuotaError{Limit: limit, RetryAfter: next.Sub(now)}
}

// releaseDebt is the releases of quota holds not yet written.
type releaseDebt struct {
	mu sync.Mutex
	n  map[[2]string]int64 // user, month -> holds to give back
}

func (d *releaseDebt) add(user, month string, n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[[2]string]int64{}
	}
	if d.n[[2]string{user, month}] += n; d.n[[2]string{user, month}] <= 0 {
		delete(d.n, [2]string{user, month})
	}
}

func (d *releaseDebt) take() map[[2]string]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.n
	d.n = nil
	return n
}

// retryReleases writes the releases owed, in one group write; what fails
// is owed again.
func (m *Money) retryReleases() {
	owed := m.releases.take()
	if len(owed) == 0 {
		return
	}
	op := &groupOp{what: "quota hold release", then: func(committed bool) {
		if !committed {
			m.oweReleases(owed)
			m.retryReleases()
		}
	}}
	for k, n := range owed {
		op.steps = append(op.steps, step{rank: rankUser, key: userKey(k[0], userHolds, k[1]) + holdEnd,
			row: &rowStep{kind: rowHoldEnd, user: k[0], period: k[1], owner: m.owner, n: n}})
	}
	ctx, cancel := m.ctx()
	defer cancel()
	// Perhaps given back (ErrMaybeCommitted): sent again, it could end
	// other reads' holds. They count against the users' quotas (the safe
	// side) until the outcome is read back (op.then), once the database
	// answers.
	if err := m.do(ctx, op); err != nil && !errors.Is(err, budget.ErrMaybeCommitted) {
		m.oweReleases(owed)
	}
}

// oweReleases owes again the releases of owed, which were not written.
func (m *Money) oweReleases(owed map[[2]string]int64) {
	for k, n := range owed {
		m.releases.add(k[0], k[1], n)
	}
}
