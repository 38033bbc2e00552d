package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"breakwater/budget"
	"breakwater/storage"
)

// check reads the database of the stopped server and checks every promise
// against what the clients received and what the fake Gemini counted. A
// database that does not open (or fails bbolt's consistency check) is a
// violation and ends the loop: nothing after it could be trusted.
func (l *loop) check(round int) error {
	db, err := storage.Open(l.dbPath, storage.Options{
		Timeout: 5 * time.Second,
		Check:   true, // bbolt's tx.Check over every page
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		l.violate("round %d: the database does not open or fails its consistency check: %v", round, err)
		return fmt.Errorf("database: %w", err)
	}
	defer db.Close()
	bad := func(format string, args ...any) {
		// Checks are cumulative: a broken promise is reported in the
		// round it is first seen, not again in every round after.
		msg := fmt.Sprintf(format, args...)
		if !l.reported[msg] {
			l.reported[msg] = true
			l.violate("round %d: %s", round, msg)
		}
	}

	rows, err := db.Usage(time.Time{}, time.Time{})
	if err != nil {
		return err
	}
	byID := make(map[string]budget.UsageRecord, len(rows))
	rowsByUser := map[string]int64{}
	first := time.Now()
	for _, r := range rows {
		if _, dup := byID[r.RequestID]; dup {
			bad("request %s has two usage rows", r.RequestID)
		}
		byID[r.RequestID] = r
		rowsByUser[r.UserID]++
		first = minTime(first, r.Time)
	}
	l.rep.UsageRows = len(rows)

	// Every 200 has its usage row, under its user.
	l.mu.Lock()
	ok := make(map[string]string, len(l.ok))
	for id, user := range l.ok {
		ok[id] = user
	}
	okByUser := make(map[string]int64, len(l.okByUser))
	for u, n := range l.okByUser {
		okByUser[u] = n
	}
	l.mu.Unlock()
	for _, id := range sortedKeys(ok) {
		r, found := byID[id]
		switch {
		case !found:
			bad("a 200 without a usage row: request %s of %s", id, ok[id])
		case r.UserID != ok[id]:
			bad("request %s: usage row of %s, answered to %s", id, r.UserID, ok[id])
		}
	}

	// Nothing committed is lost.
	for id := range l.rowsSeen {
		if _, found := byID[id]; !found {
			bad("usage row of request %s, seen after an earlier round, is gone", id)
		}
	}
	for id := range byID {
		l.rowsSeen[id] = true
	}

	// Quota used: exactly the usage rows, at least the 200s, per user
	// (summed over the months the run touched: a read's quota month is the
	// month it was reserved in, its row's time when it started).
	quota := map[string]int64{}
	for m := first.UTC(); !m.After(time.Now().UTC().AddDate(0, 1, 0)); m = m.AddDate(0, 1, 0) {
		used, err := db.QuotaUsed(m.Format("2006-01"))
		if err != nil {
			return err
		}
		for u, n := range used {
			quota[u] += n
		}
	}
	for _, u := range sortedKeys(union(quota, rowsByUser, okByUser)) {
		if quota[u] != rowsByUser[u] {
			bad("user %s: quota used %d, usage rows %d", u, quota[u], rowsByUser[u])
		}
		if quota[u] < okByUser[u] {
			bad("user %s: quota used %d, below the %d 200s received", u, quota[u], okByUser[u])
		}
	}

	// The budget: the fake's count is what the provider would bill.
	callsByDay, calls := l.gemini.Calls()
	if n := l.gemini.Bad(); n > l.badSeen {
		bad("%d calls at the fake Gemini were not in the wire format", n-l.badSeen)
		l.badSeen = n
	}
	days := map[string]bool{time.Now().UTC().Format("2006-01-02"): true}
	for d := range callsByDay {
		days[d] = true
	}
	for _, r := range rows {
		days[r.Time.UTC().Format("2006-01-02")] = true
	}
	var ledger int64
	ledgerByDay := map[string]int64{}
	for _, d := range sortedKeys(days) {
		b, err := db.Budget(d)
		if err != nil {
			return err
		}
		ledgerByDay[d] = b.Requests
		ledger += b.Requests
		if b.Requests > l.o.DailyRequests {
			bad("%s: the ledger holds %d calls, over daily_requests %d", d, b.Requests, l.o.DailyRequests)
		}
		if callsByDay[d] > l.o.DailyRequests {
			bad("%s: the upstream received %d calls, over daily_requests %d", d, callsByDay[d], l.o.DailyRequests)
		}
		// A call made is in the ledger: its reservation was committed
		// before it was made. (A reservation committed whose call the
		// kill stopped is in the ledger and not at the fake: >=, not ==.)
		if len(days) == 1 && b.Requests < callsByDay[d] {
			bad("%s: the upstream received %d calls, the ledger holds %d: a reservation was lost", d, callsByDay[d], b.Requests)
		}
	}
	if ledger < calls {
		bad("the upstream received %d calls, the ledger holds %d: a reservation was lost", calls, ledger)
	}
	if int64(len(rows)) > calls {
		bad("%d usage rows for %d upstream calls", len(rows), calls)
	}
	open, err := db.OpenReservations()
	if err != nil {
		return err
	}
	l.rep.Calls, l.rep.Ledger, l.rep.Open = calls, ledger, open
	for _, n := range ledgerByDay {
		if n == l.o.DailyRequests {
			l.rep.CeilingReached = true
		}
	}
	return db.Close()
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
