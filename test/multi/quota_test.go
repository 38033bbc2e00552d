package multi

import (
	"context"
	"net/http"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// TestQuotaRaceAcrossInstances: one read left of a monthly quota, 20
// requests at once spread over both instances: exactly one 200.
func TestQuotaRaceAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const quota = 3
	p := newPair(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 100000, MonthlyQuota: quota, DailyAttempts: 1000}, 1, 10*time.Millisecond)
	client := &http.Client{Timeout: 30 * time.Second}
	var rs []result
	for i := range quota - 1 { // all but one read used, on either instance
		r := p.send(ctx, client, i%2, 0, nil)
		if r.answer.Status != http.StatusOK {
			t.Fatalf("read %d of the quota: %d %s\n%s", i+1, r.answer.Status, r.answer.Code, p.logs())
		}
		rs = append(rs, r)
	}
	race := p.burst(ctx, 20)
	t.Logf("20 requests for the last read: %v", tally(race))
	if n := len(ok(race)); n != 1 {
		t.Errorf("%d 200s for the one read left, want exactly 1", n)
	}
	for _, r := range race {
		if a := r.answer; a.Status != http.StatusOK && (a.Status != http.StatusTooManyRequests || a.Code != "quota_exceeded") {
			t.Errorf("instance %d answered %d %s, want 200 or 429 quota_exceeded", r.instance, a.Status, a.Code)
		}
	}
	p.stopAll()
	rs = append(rs, race...)
	_, upstream := p.gemini.Calls()
	b := readBooks(t, p.dbURL)
	checkRows(t, b, rs, upstream)
	if b.quotaUsed != quota || upstream != quota {
		t.Errorf("quota count %d, upstream calls %d, want %d each", b.quotaUsed, upstream, quota)
	}
}

// TestDailyLineAcrossInstances: a plan's daily line of 7 attempts, 40
// requests of one user at once over both instances: exactly 7 pass, and
// the rest are refused by the line before any upstream call.
func TestDailyLineAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const line = 7
	p := newPair(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 100000, DailyAttempts: line}, 1, 10*time.Millisecond)
	rs := p.burst(ctx, 40)
	t.Logf("40 requests, daily line %d: %v", line, tally(rs))
	if n := len(ok(rs)); n != line {
		t.Errorf("%d 200s, want exactly the line's %d", n, line)
	}
	for _, r := range rs {
		if a := r.answer; a.Status != http.StatusOK && (a.Status != http.StatusTooManyRequests || a.Code != "daily_limit") {
			t.Errorf("instance %d answered %d %s, want 200 or 429 daily_limit", r.instance, a.Status, a.Code)
		}
	}
	p.stopAll()
	_, upstream := p.gemini.Calls()
	if upstream != line {
		t.Errorf("%d upstream calls, want %d", upstream, line)
	}
	checkRows(t, readBooks(t, p.dbURL), rs, upstream)
}
