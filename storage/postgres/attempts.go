package postgres

import (
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// The daily attempt line (layer 2), exact across instances: attempt_counts
// holds each user's attempts per day, every instance's. Take is one
// conditional upsert that counts the attempt only while the count is under
// the line (the row's lock makes the test and the count one step), in the
// group transaction of whatever else is being written (the takes of one
// user in one group are one statement: rows.go); a refusal counts
// nothing, as in memory. Check answers from the counts this instance has
// seen: Take decides.

// Attempts is guard.AttemptCounter on the shared database.
type Attempts struct{ m *Money }

// Attempts returns the daily line of this instance.
func (m *Money) Attempts() *Attempts { return &Attempts{m: m} }

// attemptCache is the counts of today this instance has seen.
type attemptCache struct {
	mu    sync.Mutex
	day   string
	count map[string]int64
}

// at moves the cache to day (days only move forward) and reports whether
// day is the cache's day. c.mu is held.
func (c *attemptCache) at(day string) bool {
	if day > c.day {
		c.day, c.count = day, map[string]int64{}
	}
	return day == c.day
}

func (c *attemptCache) set(user, day string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at(day) {
		c.count[user] = max(c.count[user], n)
	}
}

// Check refuses, as Take would, a user this instance knows to be at the
// line (0 = no line); Take decides.
func (a *Attempts) Check(user string, line int64, now time.Time) error {
	c := &a.m.attempts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at(a.m.cal.Day(now))
	if line > 0 && c.count[user] >= line {
		return lineError(now, a.m.loc)
	}
	return nil
}

// Take counts one attempt of user against line (0 = no line) in the shared
// count, or refuses with a *budget.LineError when every instance's attempts
// today reach it. An error that is not a refusal is the database failing.
func (a *Attempts) Take(user string, line int64, now time.Time) error {
	op, done := a.takeOp(user, line, now)
	ctx, cancel := a.m.ctx()
	defer cancel()
	if err := a.m.do(ctx, op); err != nil {
		return err
	}
	return done()
}

// takeOp is Take's write, and what Take answers once it is committed.
func (a *Attempts) takeOp(user string, line int64, now time.Time) (*groupOp, func() error) {
	m := a.m
	day := m.cal.Day(now)
	var (
		count int64
		taken bool
	)
	op := &groupOp{what: "attempt", reset: func() { count, taken = 0, false }, steps: []step{{rank: rankUser, key: userKey(user, userAttempt, day),
		row: &rowStep{kind: rowAttempt, user: user, period: day, bound: line, taken: &taken, value: &count}}}}
	return op, func() error {
		if !taken {
			m.attempts.set(user, day, line)
			return lineError(now, m.loc)
		}
		m.attempts.set(user, day, count)
		return nil
	}
}

// Count returns user's attempts on the day holding now, every instance's
// (as this instance last saw them if the database cannot answer).
func (a *Attempts) Count(user string, now time.Time) int64 {
	m := a.m
	day := m.cal.Day(now)
	ctx, cancel := m.ctx()
	defer cancel()
	var n int64
	err := m.db.pool.QueryRow(ctx, "SELECT coalesce(max(count), 0) FROM attempt_counts WHERE user_id = $1 AND day = $2", user, day).Scan(&n)
	if err == nil {
		m.attempts.set(user, day, n)
	}
	c := &m.attempts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at(day)
	return c.count[user]
}

// Top returns the n users with the most attempts on the day holding now,
// every instance's, most first (nil if the database cannot answer).
func (a *Attempts) Top(n int, now time.Time) []budget.UserCount {
	m := a.m
	ctx, cancel := m.ctx()
	defer cancel()
	rows, err := m.db.pool.Query(ctx, `SELECT user_id, count FROM attempt_counts WHERE day = $1
		ORDER BY count DESC, user_id LIMIT $2`, m.cal.Day(now), n)
	if err != nil {
		m.log.Warn("postgres: top users", "error", err)
		return nil
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (budget.UserCount, error) {
		var u budget.UserCount
		err := row.Scan(&u.User, &u.Count)
		return u, err
	})
	if err != nil {
		m.log.Warn("postgres: top users", "error", err)
		return nil
	}
	return out
}

// Dirty is the write-behind's look at the counts to save: none, since
// every attempt is written as it is taken. It returns today's key as
// the write-behind expects.
func (a *Attempts) Dirty() (day string, entries map[string][]byte) {
	c := &a.m.attempts
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.day, map[string][]byte{}
}

func lineError(now time.Time, loc *time.Location) *budget.LineError {
	l := now.In(loc)
	next := time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, loc)
	return &budget.LineError{RetryAfter: next.Sub(now)}
}
