package postgres_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/server/guard"
	"breakwater/storage/postgres"
)

var _ guard.AttemptsAndQuotas = (*postgres.Quotas)(nil)

// newGuard is a guard over an instance's daily line and quotas (layers 2
// and 2b), as the service wires them.
func newGuard(t *testing.T, in *instance) *guard.Guard {
	t.Helper()
	g, err := guard.New(guard.Layers{Attempts: in.m.Attempts(), Quotas: in.m.Quotas(), Usage: in.m}, guard.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// holds is user's quota holds in the database, every instance's.
func holds(t *testing.T, in *instance, user string) int64 {
	t.Helper()
	var n int64
	err := in.db.Pool().QueryRow(context.Background(), "SELECT coalesce(sum(n), 0) FROM quota_holds WHERE user_id = $1", user).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitHolds waits (bounded) for the releases, which are not waited for,
// to leave user's holds at want.
func waitHolds(t *testing.T, in *instance, user string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for holds(t, in, user) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d quota slots, want %d", user, holds(t, in, user), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The guard takes the attempt and reserves the quota slot in one group
// transaction on postgres (one commit waited for before the call, not
// two), and both are written.
func TestGuardTakesAttemptAndSlotInOneTransaction(t *testing.T) {
	t.Parallel()
	in := openInstance(t, migratedDatabase(t))
	g := newGuard(t, in)
	tk, r := g.Admit(guard.Request{Key: "kim", DailyLine: 5, MonthlyQuota: 5}, testNow)
	if r != nil {
		t.Fatalf("Admit: %+v", r)
	}
	before := in.m.Transactions()
	if r := tk.Reserve(0, testNow); r != nil {
		t.Fatalf("Reserve: %+v", r)
	}
	if n := in.m.Transactions() - before; n != 1 {
		t.Fatalf("Reserve committed %d transactions, want 1", n)
	}
	if n := in.m.Attempts().Count("kim", testNow); n != 1 {
		t.Fatalf("%d attempts counted, want 1", n)
	}
	if n := holds(t, in, "kim"); n != 1 {
		t.Fatalf("%d quota slots held, want 1", n)
	}
	tk.Release()
	waitHolds(t, in, "kim", 0)
}

// 60 requests of one user at once over two instances, each Admit then
// Reserve through the guard: the daily line (10) lets exactly 10 through
// across both, a request the line refuses keeps no quota slot, and with a
// quota of 4 and no line exactly 4 get a slot.
func TestGuardOneWriteLimitsStayExactAcrossInstances(t *testing.T) {
	t.Parallel()
	in := twoInstances(t)
	guards := [2]*guard.Guard{newGuard(t, in[0]), newGuard(t, in[1])}
	run := func(user string, line, quota int64) (passed int64, layers map[string]int64) {
		var (
			ok  atomic.Int64
			mu  sync.Mutex
			wg  sync.WaitGroup
			got = map[string]int64{}
		)
		for i := range 60 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk, r := guards[i%2].Admit(guard.Request{Key: user, DailyLine: line, MonthlyQuota: quota}, testNow)
				if r == nil {
					r = tk.Reserve(0, testNow)
				}
				if r != nil {
					mu.Lock()
					got[r.Layer]++
					mu.Unlock()
					return
				}
				ok.Add(1) // the slot stays held: the read is in flight
			}()
		}
		wg.Wait()
		return ok.Load(), got
	}
	passed, refused := run("lee", 10, 1000)
	if passed != 10 || refused[guard.LayerAttempts] != 50 {
		t.Fatalf("line 10: %d passed, refusals %v; want 10 and 50 by the attempts layer", passed, refused)
	}
	waitHolds(t, in[0], "lee", 10)
	if n := in[1].m.Attempts().Count("lee", testNow); n != 10 {
		t.Fatalf("%d attempts counted, want 10", n)
	}
	passed, refused = run("max", 0, 4)
	if passed != 4 || refused[guard.LayerQuota] != 56 {
		t.Fatalf("quota 4: %d passed, refusals %v; want 4 and 56 by the quota layer", passed, refused)
	}
	if n := holds(t, in[0], "max"); n != 4 {
		t.Fatalf("%d quota slots held, want 4", n)
	}
}
