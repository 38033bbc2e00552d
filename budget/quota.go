package budget

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrQuotaExhausted is wrapped by every *QuotaError.
var ErrQuotaExhausted = errors.New("budget: monthly quota used up")

// QuotaError refuses a request whose user has no read left this month.
type QuotaError struct {
	Limit      int64         // the plan's monthly quota (users see it in every response)
	RetryAfter time.Duration // until the next month starts in the configured zone
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("budget: monthly quota of %d used up, resets in %s", e.Limit, e.RetryAfter.Round(time.Second))
}

func (e *QuotaError) Unwrap() error { return ErrQuotaExhausted }

// Slot is one reserved read, to be confirmed after the usage record is on
// disk, or released if the read failed.
type Slot struct {
	User  string
	Month string // "2006-01" in the configured zone: the month the read counts in
	Limit int64
}

// Quotas tracks each user's successful reads this month and the reads in
// flight, so that parallel requests never reserve more than what is left.
// The zero value is not usable; call NewQuotas.
type Quotas struct {
	loc *time.Location
	cal *Calendar

	mu       sync.Mutex
	month    string
	used     map[string]int64 // durable successes this month (mirrors storage)
	inFlight map[string]int64 // reserved, neither confirmed nor released
}

// NewQuotas returns a tracker for month ("2006-01" in loc) starting from the
// durable counts in used (user to successful reads), as loaded from storage.
func NewQuotas(loc *time.Location, month string, used map[string]int64) *Quotas {
	q := &Quotas{loc: loc, cal: NewCalendar(loc), month: month, used: make(map[string]int64, len(used)), inFlight: map[string]int64{}}
	for u, n := range used {
		q.used[u] = n
	}
	return q
}

// Reserve takes one read of user's monthly quota of limit, or returns a
// *QuotaError when used plus in-flight reads already reach it.
func (q *Quotas) Reserve(user string, limit int64, now time.Time) (Slot, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.check(user, limit, now); err != nil {
		return Slot{}, err
	}
	q.inFlight[user]++
	return Slot{User: user, Month: q.month, Limit: limit}, nil
}

// Check refuses, as Reserve would, a user with no read left, without
// reserving anything: a cheap look before the request body is read.
func (q *Quotas) Check(user string, limit int64, now time.Time) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.check(user, limit, now)
}

func (q *Quotas) check(user string, limit int64, now time.Time) error {
	q.rollover(q.cal.Month(now))
	if q.used[user]+q.inFlight[user] >= limit {
		return &QuotaError{Limit: limit, RetryAfter: nextMonth(now, q.loc).Sub(now)}
	}
	return nil
}

// Confirm turns a reservation into a used read, once its usage record is
// durable, and returns the user's reads used in the slot's month.
func (q *Quotas) Confirm(s Slot) (used int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.Month != q.month {
		// The month turned while the read was in flight: it was recorded
		// under its own month, and this month's count is what users see.
		return q.used[s.User]
	}
	q.dropInFlight(s.User)
	q.used[s.User]++
	return q.used[s.User]
}

// Release gives back a reservation whose read did not succeed.
func (q *Quotas) Release(s Slot) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.Month == q.month {
		q.dropInFlight(s.User)
	}
}

// Used returns user's confirmed reads in the month holding now.
func (q *Quotas) Used(user string, now time.Time) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rollover(q.cal.Month(now))
	return q.used[user]
}

func (q *Quotas) dropInFlight(user string) {
	if q.inFlight[user] <= 1 {
		delete(q.inFlight, user)
		return
	}
	q.inFlight[user]--
}

// rollover starts a new month's counts. Reservations still in flight from the
// old month are settled against the old month by their Slot. Months only
// move forward: a request whose clock reading is older than the current
// month (it started before midnight and got here after) counts in the
// current month, so that no count is ever wiped by going back.
func (q *Quotas) rollover(month string) {
	if month <= q.month {
		return
	}
	q.month = month
	q.used = map[string]int64{}
	q.inFlight = map[string]int64{}
}
