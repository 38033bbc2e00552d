package postgres

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/limiter"
)

// The admission of an OCR request in one round trip: its rate window and
// burst (layer 1, the user's shared windows), its attempt under the daily
// line (2) and its quota slot (2b) are decided by one call of bw_admit
// (migrations 0008 and 0009) in the counters lane's group transaction.
// The admissions of one user under the same limits that a group carries
// are one call, which decides them in their callers' order; a lone one,
// the common case, is one call of bw_admit_one, which decides the same
// without bw_admit's arrays.

// admitLimits are what an admission is decided under. Admissions of one
// user in one group under equal limits are decided by one call.
type admitLimits struct {
	window   string         // the shared windows' name; "": no rate limit
	cfg      limiter.Config // their thresholds, defaults applied
	stopRate bool           // a window's refusal ends the admission
	day      string
	line     int64 // 0: no line
	stopLine bool  // the line's refusal ends the admission
	month    string
	limit    int64
	owner    string // this instance, whose holds row takes the slot
}

// admitStep is one request's admission, and its answer once the group has
// run.
type admitStep struct {
	user   string
	limits admitLimits
	now    time.Time

	wait           time.Duration // the window's: 0 when admitted
	reason         string
	taken, held    bool  // the attempt, the quota slot
	attempts, used int64 // the day's attempts and the month's recorded reads after the call
}

// JoinsWindows reports whether store is a shared windows of this
// instance's database, which TakeAndReserve can decide in its write.
func (q *Quotas) JoinsWindows(store limiter.SharedWindows) bool {
	w, ok := store.(*Windows)
	return ok && w.l.db == q.m.db
}

// TakeAndReserve admits one request of user in one group write: layer 1's
// window (window.Store, which JoinsWindows accepts; none when nil), then
// the attempt under line (0: none), then a slot of the quota of limit. A
// window's refusal is refused; when window.Enforce, nothing else is taken
// (take and reserve nil, no slot). An attempt over the line is take (a
// *budget.LineError); when enforceLine, no slot is taken for it (reserve
// nil, no slot). Otherwise reserve is the slot's answer, as Reserve's. On
// a database error, take and reserve are that error, take with a
// RefusedClosed method that reports true (the request is refused by the
// slot's failure).
func (q *Quotas) TakeAndReserve(user string, window limiter.Joined, line int64, enforceLine bool, limit int64,
	now time.Time) (slot budget.Slot, refused *limiter.Refusal, take, reserve error) {
	m := q.m
	s := &admitStep{user: user, now: now, limits: admitLimits{stopRate: window.Enforce, day: m.cal.Day(now), line: line,
		stopLine: enforceLine, month: m.cal.Month(now), limit: limit, owner: m.owner}}
	if w, ok := window.Store.(*Windows); ok {
		s.limits.window, s.limits.cfg = w.name, window.Config.WithDefaults()
	} else if window.Store != nil {
		err := errors.New("postgres: the rate window is not this database's: it cannot be decided in the admission")
		return budget.Slot{}, nil, refusedClosed{err}, err
	}
	op := &groupOp{what: "admission", reset: s.reset, steps: []step{{rank: rankUser, key: userKey(user, userAdmit, ""), admit: s}}}
	ctx, cancel := m.ctx()
	defer cancel()
	if err := m.do(ctx, op); err != nil {
		err = fmt.Errorf("postgres: admit a request: %w", err)
		return budget.Slot{}, nil, refusedClosed{err}, err
	}
	return s.answer(m)
}

// refusedClosed is the attempt's failure when the admission's write
// failed: the quota slot, which fails closed, failed with it, so the
// request is refused (503), not let through as a failed attempt count
// alone would be. RefusedClosed says so to the log of the fail-open
// layers (server/api), which knows no storage.
type refusedClosed struct{ error }

func (e refusedClosed) Unwrap() error { return e.error }

// RefusedClosed reports that the request was refused, not let through.
func (refusedClosed) RefusedClosed() bool { return true }

func (s *admitStep) reset() {
	s.wait, s.reason, s.taken, s.held, s.attempts, s.used = 0, "", false, false, 0, 0
}

// answer is TakeAndReserve's answer from s's, noted in the caches.
func (s *admitStep) answer(m *Money) (slot budget.Slot, refused *limiter.Refusal, take, reserve error) {
	l := s.limits
	m.cache.setUsed(s.user, l.month, s.used)
	if s.wait > 0 {
		refused = &limiter.Refusal{RetryAfter: s.wait, Reason: s.reason}
		if l.stopRate {
			return budget.Slot{}, refused, nil, nil
		}
	}
	if !s.taken {
		m.attempts.set(s.user, l.day, l.line)
		take = lineError(s.now, m.loc)
		if l.stopLine {
			return budget.Slot{}, refused, take, nil
		}
	} else {
		m.attempts.set(s.user, l.day, s.attempts)
	}
	if !s.held {
		return budget.Slot{}, refused, take, quotaError(l.limit, s.now, m.loc)
	}
	m.cache.addInFlight(s.user, l.month, 1)
	return budget.Slot{User: s.user, Month: l.month, Limit: l.limit}, refused, take, nil
}

// mergeAdmits replaces each run of admissions of one user under equal
// limits (sorted steps: a user's are next to each other, in the callers'
// order) by one call of bw_admit.
func mergeAdmits(steps []step) []step {
	return mergeRuns(steps, func(s step) bool { return s.admit != nil }, func(a, b step) bool {
		return a.key == b.key && a.admit.limits == b.admit.limits
	}, func(same []step) step {
		run := make([]*admitStep, len(same))
		for i, s := range same {
			run[i] = s.admit
		}
		return step{rank: same[0].rank, key: same[0].key, queue: queueAdmits(run)}
	})
}

// queueAdmits queues the one call that decides run (admissions of one
// user under equal limits), and hands each its answer.
func queueAdmits(run []*admitStep) func(b *pgx.Batch) {
	first, l := run[0], run[0].limits
	nows := make([]int64, len(run))
	alive := first.now
	for i, s := range run {
		nows[i] = s.now.UnixNano()
		if s.now.Before(alive) {
			alive = s.now // the earliest: every holder live for one of them counts
		}
	}
	var window any // NULL: no rate limit
	if l.window != "" {
		window = l.window
	}
	if len(run) == 1 {
		return queueAdmit(first, window)
	}
	return func(b *pgx.Batch) {
		b.Queue(`SELECT waits, reasons, taken, held, attempts, used FROM bw_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
			$11, $12, $13, $14)`, window, first.user, nows, l.cfg.Rate, int64(l.cfg.Window), l.cfg.Burst, l.stopRate,
			l.day, l.line, l.stopLine, l.month, l.owner, alive.Add(-HoldTTL), l.limit,
		).QueryRow(func(row pgx.Row) error {
			var (
				waits          []int64
				reasons        []string
				taken, held    []bool
				attempts, used int64
			)
			if err := row.Scan(&waits, &reasons, &taken, &held, &attempts, &used); err != nil {
				return err
			}
			if len(waits) != len(run) || len(reasons) != len(run) || len(taken) != len(run) || len(held) != len(run) {
				return fmt.Errorf("postgres: bw_admit answered %d of %d admissions", len(waits), len(run))
			}
			for i, s := range run {
				s.wait, s.reason, s.taken, s.held = time.Duration(waits[i]), reasons[i], taken[i], held[i]
				s.attempts, s.used = attempts, used
			}
			return nil
		})
	}
}

// queueAdmit queues the call that decides s, alone in its run: bw_admit_one
// (migration 0009), bw_admit's decisions for one request without its
// arrays and loops.
func queueAdmit(s *admitStep, window any) func(b *pgx.Batch) {
	l := s.limits
	return func(b *pgx.Batch) {
		b.Queue(`SELECT wait, reason, taken, held, attempts, used FROM bw_admit_one($1, $2, $3, $4, $5, $6, $7, $8, $9,
			$10, $11, $12, $13, $14)`, window, s.user, s.now.UnixNano(), l.cfg.Rate, int64(l.cfg.Window), l.cfg.Burst,
			l.stopRate, l.day, l.line, l.stopLine, l.month, l.owner, s.now.Add(-HoldTTL), l.limit,
		).QueryRow(func(row pgx.Row) error {
			var wait int64
			if err := row.Scan(&wait, &s.reason, &s.taken, &s.held, &s.attempts, &s.used); err != nil {
				return err
			}
			s.wait = time.Duration(wait)
			return nil
		})
	}
}
