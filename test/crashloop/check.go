package main

import (
	"fmt"
	"time"

	"breakwater/budget"
)

// check reads the database of the stopped server and checks every promise
// against what the clients received and what the fake Gemini counted. A
// database that does not open (or, on bolt, fails bbolt's consistency
// check) is a violation and ends the loop: nothing after it could be
// trusted.
func (l *loop) check(round int) error {
	db, err := l.openBooks()
	if err != nil {
		l.violate("round %d: the database does not open or fails its consistency check: %v", round, err)
		return fmt.Errorf("database: %w", err)
	}
	defer db.Close()
	bad := l.reporter(round)

	u, err := l.readUsage(db, bad)
	if err != nil {
		return err
	}
	okByUser := l.checkAnswered(u, bad)
	l.checkKept(u, bad)
	if err := l.checkQuota(db, u, okByUser, bad); err != nil {
		return err
	}
	if err := l.checkBudget(db, u, bad); err != nil {
		return err
	}
	return db.Close()
}

// usage is the usage rows of the database, as the checks read them.
type usage struct {
	rows       []budget.UsageRecord
	byID       map[string]budget.UsageRecord
	rowsByUser map[string]int64
	first      time.Time // the earliest row's time, or now
}

// reporter returns the function the checks report a broken promise with.
// Checks are cumulative: a broken promise is reported in the round it is
// first seen, not again in every round after.
func (l *loop) reporter(round int) func(format string, args ...any) {
	return func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if !l.reported[msg] {
			l.reported[msg] = true
			l.violate("round %d: %s", round, msg)
		}
	}
}

// readUsage reads every usage row and checks that no request has two.
func (l *loop) readUsage(db books, bad func(string, ...any)) (usage, error) {
	rows, err := db.Usage(time.Time{}, time.Time{})
	if err != nil {
		return usage{}, err
	}
	u := usage{
		rows:       rows,
		byID:       make(map[string]budget.UsageRecord, len(rows)),
		rowsByUser: map[string]int64{},
		first:      time.Now(),
	}
	for _, r := range rows {
		if _, dup := u.byID[r.RequestID]; dup {
			bad("request %s has two usage rows", r.RequestID)
		}
		u.byID[r.RequestID] = r
		u.rowsByUser[r.UserID]++
		u.first = minTime(u.first, r.Time)
	}
	l.rep.UsageRows = len(rows)
	return u, nil
}

// checkAnswered checks that every 200 has its usage row, under its user.
// It returns the 200s received per user.
func (l *loop) checkAnswered(u usage, bad func(string, ...any)) map[string]int64 {
	l.mu.Lock()
	ok := make(map[string]string, len(l.ok))
	for id, user := range l.ok {
		ok[id] = user
	}
	okByUser := make(map[string]int64, len(l.okByUser))
	for user, n := range l.okByUser {
		okByUser[user] = n
	}
	l.mu.Unlock()
	for _, id := range sortedKeys(ok) {
		r, found := u.byID[id]
		switch {
		case !found:
			bad("a 200 without a usage row: request %s of %s", id, ok[id])
		case r.UserID != ok[id]:
			bad("request %s: usage row of %s, answered to %s", id, r.UserID, ok[id])
		}
	}
	return okByUser
}

// checkKept checks that nothing committed is lost: every usage row seen
// after an earlier round is still there.
func (l *loop) checkKept(u usage, bad func(string, ...any)) {
	for id := range l.rowsSeen {
		if _, found := u.byID[id]; !found {
			bad("usage row of request %s, seen after an earlier round, is gone", id)
		}
	}
	for id := range u.byID {
		l.rowsSeen[id] = true
	}
}

// checkQuota checks the quota used: exactly the usage rows, at least the
// 200s, per user (summed over the months the run touched: a read's quota
// month is the month it was reserved in, its row's time when it started).
func (l *loop) checkQuota(db books, u usage, okByUser map[string]int64, bad func(string, ...any)) error {
	quota := map[string]int64{}
	for m := u.first.UTC(); !m.After(time.Now().UTC().AddDate(0, 1, 0)); m = m.AddDate(0, 1, 0) {
		used, err := db.QuotaUsed(m.Format("2006-01"))
		if err != nil {
			return err
		}
		for user, n := range used {
			quota[user] += n
		}
	}
	for _, user := range sortedKeys(union(quota, u.rowsByUser, okByUser)) {
		if quota[user] != u.rowsByUser[user] {
			bad("user %s: quota used %d, usage rows %d", user, quota[user], u.rowsByUser[user])
		}
		if quota[user] < okByUser[user] {
			bad("user %s: quota used %d, below the %d 200s received", user, quota[user], okByUser[user])
		}
	}
	return nil
}

// checkBudget checks the budget against the fake's count, which is what
// the provider would bill: the calls are in the wire format, no day is
// over daily_requests in the ledger or upstream, and every call made is in
// the ledger. It records the figures in the report.
func (l *loop) checkBudget(db books, u usage, bad func(string, ...any)) error {
	callsByDay, calls := l.gemini.Calls()
	if n := l.gemini.Bad(); n > l.badSeen {
		bad("%d calls at the fake Gemini were not in the wire format", n-l.badSeen)
		l.badSeen = n
	}
	days := map[string]bool{time.Now().UTC().Format("2006-01-02"): true}
	for d := range callsByDay {
		days[d] = true
	}
	for _, r := range u.rows {
		days[r.Time.UTC().Format("2006-01-02")] = true
	}
	var ledger int64
	ledgerByDay := map[string]int64{}
	for _, d := range sortedKeys(days) {
		requests, err := db.LedgerCalls(d)
		if err != nil {
			return err
		}
		ledgerByDay[d] = requests
		ledger += requests
		if requests > l.o.DailyRequests {
			bad("%s: the ledger holds %d calls, over daily_requests %d", d, requests, l.o.DailyRequests)
		}
		if callsByDay[d] > l.o.DailyRequests {
			bad("%s: the upstream received %d calls, over daily_requests %d", d, callsByDay[d], l.o.DailyRequests)
		}
		// A call made is in the ledger: its reservation was committed
		// before it was made. (A reservation committed whose call the
		// kill stopped is in the ledger and not at the fake: >=, not ==.)
		if len(days) == 1 && requests < callsByDay[d] {
			bad("%s: the upstream received %d calls, the ledger holds %d: a reservation was lost", d, callsByDay[d], requests)
		}
	}
	if ledger < calls {
		bad("the upstream received %d calls, the ledger holds %d: a reservation was lost", calls, ledger)
	}
	if int64(len(u.rows)) > calls {
		bad("%d usage rows for %d upstream calls", len(u.rows), calls)
	}
	// The ledger counts more than the calls made by what the kills left:
	// the unused rest of the budget lease, and the calls in flight whose
	// headroom was committed and that never reached the fake. Each kill
	// adds at most one lease and one call per client.
	excess := ledger - calls
	lease := budget.MaxLease(budget.Config{DailyRequests: l.o.DailyRequests})
	if bound := lease + int64(l.o.Workers); excess-l.rep.Excess > bound {
		bad("the ledger's excess over the calls made grew by %d in one round, over the bound of %d (a lease of %d and %d clients)",
			excess-l.rep.Excess, bound, lease, l.o.Workers)
	}
	open, err := db.OpenReservations()
	if err != nil {
		return err
	}
	l.rep.Calls, l.rep.Ledger, l.rep.Open = calls, ledger, open
	l.rep.MaxLease = lease
	l.rep.MostExcess = max(l.rep.MostExcess, excess-l.rep.Excess)
	l.rep.Excess = max(excess, l.rep.Excess)
	for _, n := range ledgerByDay {
		if n == l.o.DailyRequests {
			l.rep.CeilingReached = true
		}
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func union(ms ...map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, m := range ms {
		for k := range m {
			out[k] = 0
		}
	}
	return out
}
