package postgres_test

import (
	"maps"
	"testing"

	"breakwater/limiter"
)

// An attempt the fail limit refuses costs the database what a failure
// costs, so that the invite check, which ends a wrong code's attempt as
// a failure and a refused one with the release of nothing, takes as long
// for a cooldown (of the address, the e-mail or both), attempts in
// flight or the net as for a wrong code (issue 38, item 5): the same
// scans of the same tables, the same rows fetched, inserted and updated,
// counted exactly by pg_stat_xact_user_tables where time is noisy. The
// keys are ones seen before, as a guesser's are. Before migration 0012
// a refusal read the net's hour once where a failure read it twice and
// counted itself, and wrote no attempt in progress: in a cooldown, 2
// index scans and 2 updates fewer on limit_fails, 2 scans and the update
// fewer on limit_fail_minutes (the net: 6 scans fewer on limit_fails).
func TestFailsRefusalDoesTheWorkOfAFailure(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	f := db.Limits().Fails("invites")
	cfg := limiter.FailConfig{Limit: 3, GlobalPerHour: 1000}.WithDefaults()
	now := lt0
	for _, keys := range [][]string{
		{"ip:192.0.2.1", "email:a@example.com"}, {"ip:192.0.2.2", "email:b@example.com"},
		{"ip:192.0.2.3", "email:c@example.com"}, {"ip:192.0.2.4", "email:d@example.com"},
		{"ip:203.0.113.1", "email:cool@example.com"}, {"ip:203.0.113.1", "email:cool@example.com"},
		{"ip:203.0.113.1", "email:cool@example.com"}, // the third failure: both cool down
		{"ip:198.51.100.1", "email:e@example.com"}, {"ip:198.51.100.1", "email:f@example.com"},
	} {
		if r, _, err := f.AttemptWork(keys, cfg, now); r != nil || err != nil {
			t.Fatalf("failure on %q = %v, %v", keys, r, err)
		}
	}
	if r, err := f.Begin([]string{"ip:198.51.100.1"}, cfg, now); r != nil || err != nil { // two failures and one in flight
		t.Fatalf("Begin = %v, %v", r, err)
	}
	net := cfg
	net.GlobalPerHour = mustGlobal(t, f, now)
	r, failure, err := f.AttemptWork([]string{"ip:192.0.2.1", "email:a@example.com"}, cfg, now)
	if r != nil || err != nil || len(failure) == 0 {
		t.Fatalf("a failure = %v, %v, work %v", r, err, failure)
	}
	t.Logf("a failure's work: %+v", failure)
	for _, c := range []struct {
		name   string
		keys   []string
		cfg    limiter.FailConfig
		reason string
	}{
		{"the address's cooldown", []string{"ip:203.0.113.1", "email:b@example.com"}, cfg, limiter.ReasonCooldown},
		{"the e-mail's cooldown", []string{"ip:192.0.2.3", "email:cool@example.com"}, cfg, limiter.ReasonCooldown},
		{"both in a cooldown", []string{"ip:203.0.113.1", "email:cool@example.com"}, cfg, limiter.ReasonCooldown},
		{"attempts in flight", []string{"ip:198.51.100.1", "email:d@example.com"}, cfg, limiter.ReasonInFlight},
		{"the net", []string{"ip:192.0.2.2", "email:b@example.com"}, net, limiter.ReasonGlobal},
	} {
		r, work, err := f.AttemptWork(c.keys, c.cfg, now)
		if err != nil || r == nil || r.Reason != c.reason {
			t.Errorf("%s: refusal %v (%v), want %s", c.name, r, err, c.reason)
			continue
		}
		if !maps.Equal(work, failure) {
			t.Errorf("%s: the database's work %+v; a failure's %+v", c.name, work, failure)
		}
	}
}
