package budget

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestQuotaSteps(t *testing.T) {
	loc := time.UTC
	t0 := time.Date(2026, 11, 30, 23, 0, 0, 0, loc)
	q := NewQuotas(loc, MonthKey(t0, loc), map[string]int64{"alice": 1})

	s1, err := q.Reserve("alice", 3, t0)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := q.Reserve("alice", 3, t0)
	if err != nil {
		t.Fatal(err)
	}
	// 1 used + 2 in flight = 3: full, even before either read finishes.
	_, err = q.Reserve("alice", 3, t0)
	var qe *QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("third reserve: %v, want *QuotaError", err)
	}
	if got, want := qe.RetryAfter, time.Hour; got != want {
		t.Errorf("RetryAfter %v, want %v (until December)", got, want)
	}
	// A failed read gives its slot back; a confirmed one counts.
	q.Release(s1)
	if got := q.Confirm(s2); got != 2 {
		t.Errorf("used after confirm %d, want 2", got)
	}
	if _, err := q.Reserve("alice", 3, t0); err != nil {
		t.Errorf("slot released but reserve failed: %v", err)
	}
	// Other users are not affected.
	if _, err := q.Reserve("bob", 1, t0); err != nil {
		t.Error(err)
	}
	// Next month starts afresh; a slot from November confirmed in December
	// does not count in December.
	dec := t0.Add(2 * time.Hour)
	if got := q.Used("alice", dec); got != 0 {
		t.Errorf("December used %d, want 0", got)
	}
	if s, err := q.Reserve("alice", 3, dec); err != nil || s.Month != "2026-12" {
		t.Errorf("December reserve %+v %v", s, err)
	}
}

func TestQuotaTimezone(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	// 2026-11-30 16:00 UTC is already December 1st in Tokyo.
	now := time.Date(2026, 11, 30, 16, 0, 0, 0, time.UTC)
	if got := MonthKey(now, tokyo); got != "2026-12" {
		t.Errorf("month %q, want 2026-12", got)
	}
	q := NewQuotas(tokyo, "2026-12", nil)
	q.Reserve("a", 1, now)
	_, err = q.Reserve("a", 1, now)
	var qe *QuotaError
	if !errors.As(err, &qe) {
		t.Fatal(err)
	}
	// Until 2027-01-01 00:00 Tokyo = 2026-12-31 15:00 UTC.
	if got, want := now.Add(qe.RetryAfter), time.Date(2026, 12, 31, 15, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("resets at %v, want %v", got, want)
	}
}

func TestQuotaParallelNeverOvershoots(t *testing.T) {
	q := NewQuotas(time.UTC, MonthKey(time.Now(), time.UTC), map[string]int64{"u": 90})
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s, err := q.Reserve("u", 100, time.Now()); err == nil {
				granted.Add(1)
				q.Confirm(s)
			}
		}()
	}
	wg.Wait()
	if granted.Load() != 10 || q.Used("u", time.Now()) != 100 {
		t.Errorf("granted %d, used %d; want 10 and 100", granted.Load(), q.Used("u", time.Now()))
	}
}

func TestValidatePlans(t *testing.T) {
	cases := []struct {
		name  string
		plans map[string]Plan
		ok    bool
	}{
		{"none", nil, false},
		{"zero quota", map[string]Plan{"free": {}}, false},
		{"negative", map[string]Plan{"free": {MonthlyQuota: -1}}, false},
		{"good", map[string]Plan{"free": {MonthlyQuota: 1}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := ValidatePlans(c.plans); (err == nil) != c.ok {
				t.Errorf("ValidatePlans: %v, want ok=%v", err, c.ok)
			}
		})
	}
}

// TestRolloverOnlyForward: a request that read the clock before midnight
// and reaches the tracker after the month turned must not take the tracker
// back and wipe either month's counts.
func TestRolloverOnlyForward(t *testing.T) {
	jan := time.Date(2027, 1, 31, 23, 59, 59, 0, time.UTC)
	feb := jan.Add(2 * time.Second)
	q := NewQuotas(time.UTC, "2027-01", map[string]int64{"u": 3})
	s, err := q.Reserve("u", 3, feb) // February: a fresh month
	if err != nil {
		t.Fatal(err)
	}
	q.Confirm(s)
	// A late January reading: counted in February, which has 1 of 3 used.
	for range 2 {
		s, err := q.Reserve("u", 3, jan)
		if err != nil {
			t.Fatal(err)
		}
		if s.Month != "2027-02" {
			t.Errorf("late slot in %s, want 2027-02", s.Month)
		}
		q.Confirm(s)
	}
	if _, err := q.Reserve("u", 3, feb); err == nil {
		t.Error("a fourth February read was granted")
	}

	a := NewAttempts(time.UTC, "2027-02-01", map[string]int64{"u": 2})
	if err := a.Take("u", 2, jan); err == nil {
		t.Error("a late reading wiped today's attempts")
	}
}

func TestGlobalBudget(t *testing.T) {
	l := &memLedger{}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	g, err := NewGlobal(Config{DailyRequests: 3, DailyUSD: 0.001}, time.UTC, l, GlobalState{Day: "2026-11-30", Month: "2026-11", Requests: 1, Spend: 100})
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.Claim(800, now) // 100 + 800 <= 1000
	if err == nil {
		err = g.Commit(t.Context(), &r)
	}
	if err != nil || !r.Leased {
		t.Fatalf("reserve %+v %v", r, err)
	}
	_, err = g.Claim(200, now) // 900 + 200 > 1000
	var pe *PausedError
	if !errors.As(err, &pe) || pe.Ceiling != "daily_usd" {
		t.Fatalf("second reserve: %v", err)
	}
	g.Settled(r, 50) // the call cost 50, not 800
	r2, err := g.Claim(200, now)
	if err != nil {
		t.Fatalf("after settling: %v", err)
	}
	if err := g.Commit(t.Context(), &r2); err != nil {
		t.Fatal(err)
	}
	_, err = g.Claim(1, now) // the fourth call of the day
	if !errors.As(err, &pe) || pe.Ceiling != "daily_requests" {
		t.Fatalf("fourth call: %v", err)
	}
	if got := g.Status(now); got.Requests != 3 || got.SpendMicroUSD != 350 {
		t.Errorf("status %+v, want 3 requests and 350", got)
	}
	if l.reserved != 2 {
		t.Errorf("ledger got %d reservations, want 2 (refusals write nothing)", l.reserved)
	}
	// Off: no ceiling refuses, and with nothing to hold across a crash the
	// claim is not written before the call; its settlement (the usage
	// record's transaction) adds the call to the ledger whole.
	off, _ := NewGlobal(Config{}, time.UTC, l, GlobalState{})
	r, err = off.Claim(1e9, now)
	if err == nil {
		err = off.Commit(t.Context(), &r)
	}
	if err != nil || r.Committed() || !r.Unbound || l.reserved != 2 {
		t.Errorf("off: %+v %v, ledger %d reservations, want none written", r, err, l.reserved)
	}
	if s := r.Settlement(5); s.ID != 0 || s.Day == "" || s.ActualMicroUSD != 5 {
		t.Errorf("off: settlement %+v, want the call added to its day whole", s)
	}
	if st := off.Status(now); st.Requests != 1 || st.SpendMicroUSD != 1e9 || st.Engaged {
		t.Errorf("off: status %+v", st)
	}
}

type memLedger struct {
	mu       sync.Mutex
	reserved int
}

func (m *memLedger) Lease(context.Context, string, int64, int64, ...LedgerDay) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved++
	return nil
}

func (m *memLedger) Settle(context.Context, Settlement) error { return nil }
