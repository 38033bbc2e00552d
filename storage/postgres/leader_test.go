package postgres_test

import (
	"context"
	"testing"
	"time"
)

// One instance at a time leads the daily detection; a release, or the
// end of the leader's sessions (a process that died), lets another lead.
func TestLeadDetectionOneAtATime(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	releaseA, ok, err := a.LeadDetection(ctx)
	if err != nil || !ok {
		t.Fatalf("the first instance: lead = %v, %v; want it", ok, err)
	}
	if _, ok, err := b.LeadDetection(ctx); err != nil || ok {
		t.Fatalf("the second instance while the first leads: lead = %v, %v; want false", ok, err)
	}
	if _, ok, err := a.LeadDetection(ctx); err != nil || ok {
		t.Fatalf("the leader again, on another session: lead = %v, %v; want false", ok, err)
	}
	releaseA()
	releaseB, ok, err := b.LeadDetection(ctx)
	if err != nil || !ok {
		t.Fatalf("the second instance after the release: lead = %v, %v; want it", ok, err)
	}
	if _, ok, err := a.LeadDetection(ctx); err != nil || ok {
		t.Fatalf("the first instance while the second leads: lead = %v, %v; want false", ok, err)
	}
	// The second instance dies without releasing: its session ends.
	var killed int
	if err := a.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("ended %d sessions holding the lead, %v; want 1", killed, err)
	}
	// Its release finds the session gone and drops the connection (the
	// pool would not close with it out).
	defer releaseB()
	deadline := time.Now().Add(10 * time.Second)
	for {
		release, ok, err := a.LeadDetection(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lock outlived the leader's sessions")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
