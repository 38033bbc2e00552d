package postgres_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	neturl "net/url"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage/postgres/pgtest"
)

// The money path's transactions whose connection fails after the commit
// was sent (outcome.go), on a cluster of the test's own: a synchronous
// standby that never answers holds every commit past the instance's
// timeout, as a stalled standby or disk does.

// stalledCluster starts a cluster with a database "money", and an
// instance on it (its group transactions time out after 3 s: each stalled
// write of these tests waits that long).
func stalledCluster(t *testing.T) (*pgtest.Cluster, *instance, *instance) {
	t.Helper()
	c := pgtest.NewCluster(t)
	admin := openInstance(t, c.URL("postgres"))
	if _, err := admin.db.Pool().Exec(context.Background(), "CREATE DATABASE money"); err != nil {
		t.Fatal(err)
	}
	return c, admin, openInstance(t, c.URL("money"))
}

// poolerIDs is the address of a proxy to target that, as a connection
// pooler does, gives its clients session ids (BackendKeyData) of its own,
// which are no server session's.
func poolerIDs(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for id := uint32(1 << 30); ; id++ {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			go func() { defer client.Close(); rewriteIDs(client, server, id) }()
		}
	}()
	return ln.Addr().String()
}

// rewriteIDs copies the server's messages to the client, message by
// message, with id in place of the session id of BackendKeyData.
func rewriteIDs(client io.Writer, server io.Reader, id uint32) {
	for {
		head := make([]byte, 5) // type, length (counting itself)
		if _, err := io.ReadFull(server, head); err != nil {
			return
		}
		msg := make([]byte, 1+binary.BigEndian.Uint32(head[1:]))
		copy(msg, head)
		if _, err := io.ReadFull(server, msg[5:]); err != nil {
			return
		}
		if msg[0] == 'K' {
			binary.BigEndian.PutUint32(msg[5:9], id)
		}
		if _, err := client.Write(msg); err != nil {
			return
		}
	}
}

// standby makes every commit of the cluster wait for a synchronous
// standby that does not exist (on), or not (off).
func standby(t *testing.T, admin *instance, on bool) {
	t.Helper()
	stmt := "ALTER SYSTEM RESET synchronous_standby_names"
	if on {
		stmt = "ALTER SYSTEM SET synchronous_standby_names = 'nobody'"
	}
	ctx := context.Background()
	for try := 0; ; try++ { // after a restart, the pool's first try meets a closed session
		_, err := admin.db.Pool().Exec(ctx, stmt)
		if err == nil {
			_, err = admin.db.Pool().Exec(ctx, "SELECT pg_reload_conf()")
		}
		if err == nil {
			break
		}
		if try == 10 {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := map[bool]string{true: "nobody", false: ""}[on]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var got string
		if err := admin.db.Pool().QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("synchronous_standby_names is %q, want %q", got, want)
		}
	}
}

// standbyOff is standby(t, admin, false), then waits (10 s at most) until
// no session waits for the standby: the commits it held end once the
// server's processes have reloaded the setting, some time after a
// session sees it.
func standbyOff(t *testing.T, admin *instance) {
	t.Helper()
	standby(t, admin, false)
	for deadline := time.Now().Add(10 * time.Second); count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a commit still waits for the standby 10 s after it was switched off")
		}
	}
}

// count is one figure of the money database.
func count(t *testing.T, in *instance, query string) int64 {
	t.Helper()
	var n int64
	if err := in.db.Pool().QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// alicesReads reserves two reads of alice (one to record, one still in
// flight) and leases 3 calls and 3,000 µ$ for them.
func alicesReads(t *testing.T, in *instance) budget.Slot {
	t.Helper()
	q := in.m.Quotas()
	slot, err := q.Reserve("alice", 10, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Reserve("alice", 10, testNow); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := in.m.LeaseUnder(context.Background(), "2026-12-03", 3, 3000, budget.Ceilings{}); err != nil || !ok {
		t.Fatalf("lease: %v, %v", ok, err)
	}
	return slot
}

// A usage record, a settlement and a give-back whose commits outlast the
// instance's timeout did commit: the record and the settlement are no
// error (a caller that took them for failed would settle again and give
// the quota slot back, counting twice), the give-back is one that may
// have committed (its lease's answer is lost), and each is in the ledger
// once.
func TestStalledCommitIsReadBack(t *testing.T) {
	t.Parallel()
	_, admin, in := stalledCluster(t)
	slot := alicesReads(t, in)
	standby(t, admin, true)
	ctx := context.Background()
	read := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: 100, Leased: true, LeasedMicroUSD: 1000}
	if err := in.m.RecordUsage(ctx, slot.Month, usageRecord("alice"), read); err != nil {
		t.Fatalf("RecordUsage whose commit outlasted the timeout: %v, want no error (it committed)", err)
	}
	failed := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: 200, Leased: true, LeasedMicroUSD: 1000}
	if err := in.m.Settle(ctx, failed); err != nil {
		t.Fatalf("Settle whose commit outlasted the timeout: %v, want no error", err)
	}
	back := budget.LedgerDay{Day: "2026-12-03", DayTotals: budget.DayTotals{Requests: 1, SpendMicroUSD: 1000}}
	if _, _, err := in.m.LeaseUnder(ctx, "", 0, 0, budget.Ceilings{}, back); !errors.Is(err, budget.ErrMaybeCommitted) {
		t.Fatalf("a give-back whose commit outlasted the timeout: %v, want ErrMaybeCommitted", err)
	}
	standbyOff(t, admin)
	for query, want := range map[string]int64{
		"SELECT count(*) FROM usage_rows":                                        1,
		"SELECT used FROM quota_counts WHERE user_id = 'alice'":                  1,
		"SELECT sum(n) FROM quota_holds WHERE user_id = 'alice'":                 1, // the read still in flight
		"SELECT calls FROM ledger_days WHERE day = '2026-12-03'":                 2, // 3 leased, 1 given back
		"SELECT micro_usd FROM ledger_days WHERE day = '2026-12-03'":             300,
		"SELECT settled_calls FROM ledger_days WHERE day = '2026-12-03'":         2,
		"SELECT micro_usd FROM ledger_months WHERE month = '2026-12'":            300,
		"SELECT calls FROM ledger_rests WHERE day = '2026-12-03'":                0,
		"SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'":     0,
		"SELECT count(*) FROM money_groups WHERE owner = '" + in.m.Owner() + "'": 3, // both lanes and the leases
	} {
		if got := count(t, in, query); got != want {
			t.Errorf("%s: %d, want %d", query, got, want)
		}
	}
	if used := in.m.Quotas().Confirm(slot); used != 1 {
		t.Errorf("Confirm after the record: %d reads used, want 1", used)
	}
}

// A usage record whose commit was cut off with PostgreSQL itself (a
// shutdown while it waited for the standby): whether it committed cannot
// be read back, and the error says so (budget.ErrMaybeCommitted), so that
// the guard does not undo it. It did commit.
func TestUnknownOutcomeSaysMaybeCommitted(t *testing.T) {
	t.Parallel()
	c, admin, in := stalledCluster(t)
	slot := alicesReads(t, in)
	standby(t, admin, true)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		read := budget.Settlement{Day: "2026-12-03", ActualMicroUSD: 100, Leased: true, LeasedMicroUSD: 1000}
		done <- in.m.RecordUsage(ctx, slot.Month, usageRecord("alice"), read)
	}()
	for deadline := time.Now().Add(10 * time.Second); count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the record's commit never waited for the standby")
		}
	}
	c.Stop()
	if err := <-done; !errors.Is(err, budget.ErrMaybeCommitted) {
		t.Fatalf("RecordUsage cut off with the server: %v, want ErrMaybeCommitted", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	standby(t, admin, false)
	if n := count(t, in, "SELECT count(*) FROM usage_rows"); n != 1 {
		t.Errorf("%d usage rows after the restart, want the record's (it committed before the shutdown)", n)
	}
}

// A usage record whose group waited for a row lock past the timeout did
// not commit, and never will: its session is ended before the failure is
// reported, so that the caller may undo the read (settle it, give its
// slot back) without the record landing later beside the undoing. Behind
// a pooler the session is found by its server id, not the pooler's.
func TestTimedOutRecordNeverLandsLater(t *testing.T) {
	t.Parallel()
	for _, pooler := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "behind a pooler"}[pooler], func(t *testing.T) {
			url := migratedDatabase(t)
			direct := openInstance(t, url)
			if pooler {
				u, err := neturl.Parse(url)
				if err != nil {
					t.Fatal(err)
				}
				u.Host = poolerIDs(t, u.Host)
				url = u.String()
			}
			timedOutRecord(t, direct, openInstance(t, url))
		})
	}
}

func timedOutRecord(t *testing.T, direct, in *instance) {
	slot := alicesReads(t, in)
	ctx := context.Background()
	tx, err := direct.db.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT * FROM quota_counts WHERE user_id = 'alice' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	err = in.m.RecordUsage(ctx, slot.Month, usageRecord("alice"), budget.Settlement{})
	if err == nil || errors.Is(err, budget.ErrMaybeCommitted) {
		t.Fatalf("RecordUsage behind a lock: %v, want a failure that did not commit", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A session left waiting would now write the record, and be active
	// until it has.
	for deadline := time.Now().Add(10 * time.Second); count(t, direct, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'`) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a session of the database stayed active")
		}
	}
	if n := count(t, direct, "SELECT count(*) FROM usage_rows"); n != 0 {
		t.Errorf("%d usage rows after the lock was released, want none", n)
	}
	if n := count(t, direct, "SELECT sum(n) FROM quota_holds WHERE user_id = 'alice'"); n != 2 {
		t.Errorf("holds %d, want both reads still held", n)
	}
}
