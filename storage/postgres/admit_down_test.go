package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/server/guard"
	"breakwater/storage/postgres/pgtest"
)

// PostgreSQL unreachable: the joined admission cannot be written, so the
// quota refuses (closed, 503), and layer 1 still decides in memory, as it
// does when it is decided alone (the shared window fails open to the
// instance's memory, counted as a fault): past the rate a client is told
// 429, not 503 again and again with every request reaching the money
// path. The attempt's failure, reported as a fail-open of its layer,
// says that the request was refused all the same (RefusedClosed): the
// log line then says so, not "let through".
func TestAdmissionRateDecidedInMemoryWithTheDatabaseDown(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	admin := openInstance(t, c.URL("postgres"))
	if _, err := admin.db.Pool().Exec(context.Background(), "CREATE DATABASE money"); err != nil {
		t.Fatal(err)
	}
	in := openInstance(t, c.URL("money"))
	rate, err := limiter.New(limiter.Config{Rate: 2, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var faults atomic.Int64
	rate.Share(in.db.Limits().Windows("user"), func(error) { faults.Add(1) })
	var (
		mu       sync.Mutex
		attempts []error
	)
	hooks := guard.Hooks{FailedOpen: func(layer string, err error) {
		if layer == guard.LayerAttempts {
			mu.Lock()
			attempts = append(attempts, err)
			mu.Unlock()
		}
	}}
	g, err := guard.New(guard.Layers{Rate: rate, Attempts: in.m.Attempts(), Quotas: in.m.Quotas(), Usage: in.m}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	c.Stop()
	var unavailable, limited int
	for i := range 5 {
		r := admit(g, guard.Request{Key: "hal", DailyLine: 100, MonthlyQuota: 100}, testNow.Add(time.Duration(i)*time.Millisecond))
		switch {
		case r == nil:
			t.Fatalf("request %d admitted with the database down", i)
		case r.Layer == guard.LayerQuota && r.Reason == guard.ReasonUnavailable:
			unavailable++
		case r.Layer == guard.LayerRate:
			limited++
		default:
			t.Fatalf("request %d refused by %s/%s", i, r.Layer, r.Reason)
		}
	}
	if unavailable != 2 || limited != 3 {
		t.Fatalf("%d refused as unavailable, %d by the rate; want 2 and 3: the rate decided in memory", unavailable, limited)
	}
	if faults.Load() == 0 {
		t.Fatal("no fault of the shared window reported: the fail-open is not counted")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, err := range attempts {
		var rc interface{ RefusedClosed() bool }
		if !errors.As(err, &rc) || !rc.RefusedClosed() {
			t.Errorf("the attempt's fault %v does not say the request was refused", err)
		}
	}
	if len(attempts) != unavailable {
		t.Errorf("%d attempt faults for %d requests refused as unavailable", len(attempts), unavailable)
	}
}
