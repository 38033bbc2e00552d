package netcut

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"breakwater/test/harness"
)

// dbOneWay is the latency added to each direction of the cut instance's
// link to the database: 200 ms more round-trip time.
const dbOneWay = 100 * time.Millisecond

// TestDatabaseLatency gives the instance in the namespace a link to the
// database with 200 ms more round-trip time (delayRelay) and loads both
// instances into the service's daily_requests ceiling, with the users of
// a quota plan driven to their quota through both. The ceiling and the
// quotas stay exact; the test prints what the latency costs an accepted
// read (p50 and p99 on each instance; docs/INSTANCES.md gives them).
func TestDatabaseLatency(t *testing.T) {
	t.Parallel() // beside the cuts: a rig of its own
	const (
		ceiling = 1500
		quota   = 40
		users   = 4
	)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	var relay *delayRelay
	r := newRig(t, rigOptions{
		latency: [2]time.Duration{20 * time.Millisecond, 20 * time.Millisecond},
		cfg:     harness.Config{DailyRequests: ceiling, Plan: "bulk"},
		plans:   fmt.Sprintf("[plans.quota]\nmonthly_quota = %d\ndaily_attempts = 0\n", quota),
		users:   map[string]int{"bulk": bulkUsers, "quota": users},
		dbURL: func(r *rig) string {
			relay = newDelayRelay(t, r.ns.HostIP+":0", fmt.Sprintf("127.0.0.1:%d", r.cluster.Port()), dbOneWay)
			return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", relay.Addr(), dbName)
		},
	})
	// Four clients on the host instance for the bulk users, sixteen on
	// the slow one, so that both have accepted reads enough to measure
	// before the ceiling; two more on each for the quota users.
	bulk := r.load(ctx, 20, func(k int) (int, string, int) {
		if k%5 == 0 {
			return host, "bulk", (k / 5) % bulkUsers
		}
		return cut, "bulk", k % bulkUsers
	})
	edge := r.load(ctx, 4, func(k int) (int, string, int) { return k % 2, "quota", (k / 2) % users })
	paused := func() bool {
		rs := bulk.results()
		seen := [2]bool{}
		for _, res := range rs[max(0, len(rs)-64):] {
			if res.answer.Code == "budget_paused" {
				seen[res.instance] = true
			}
		}
		return seen[host] && seen[cut]
	}
	reached := waitFor(100*time.Second, paused)
	bulkRes, edgeRes := bulk.halt(), edge.halt()
	r.stop()
	all := append(slices.Clone(bulkRes), edgeRes...)
	b := r.books()
	upstream := r.upstream(host) + r.upstream(cut)
	t.Logf("%v; upstream calls: host %d, cut %d; the ledger counts %d of %d", tally(all), r.upstream(host), r.upstream(cut), b.calls, ceiling)
	if !reached {
		t.Errorf("the load did not reach the ceiling on both instances: %d upstream calls\n%s", upstream, r.logs())
	}
	if upstream > ceiling || b.calls > ceiling {
		t.Errorf("%d upstream calls, the ledger counts %d; the ceiling is %d", upstream, b.calls, ceiling)
	}
	r.checkRows(b, all)
	for u := range users {
		name := fmt.Sprint("quota", u)
		if b.byUser[name] > quota || b.used[name] > quota {
			t.Errorf("user %s: %d usage rows, the quota counts %d; the quota is %d", name, b.byUser[name], b.used[name], quota)
		}
		if b.byUser[name] < quota {
			t.Errorf("user %s: %d usage rows, the load did not reach their quota of %d", name, b.byUser[name], quota)
		}
	}

	p50, p99 := latencies(t, where(all, isOK))
	t.Logf("200 ms more round trip to the database costs an accepted read %.0f ms at the median, %.0f ms at p99",
		p50[cut]-p50[host], p99[cut]-p99[host])
	// The premise: an accepted read makes two trips to the database in
	// turn (its admission, then its usage record), each over the slow link.
	if rtt := 2 * dbOneWay; p50[cut]-p50[host] < float64(2*rtt/time.Millisecond) {
		t.Errorf("the slow link costs a read %.0f ms at the median, less than two round trips (%v): is the relay in the way?",
			p50[cut]-p50[host], 2*rtt)
	}
}

// latencies logs the p50 and p99 of each instance's accepted reads, of
// all and of those after the first 5 s, and returns the first.
func latencies(t *testing.T, oks []result) (p50, p99 [2]float64) {
	t.Helper()
	var took [2][]float64
	for _, res := range oks {
		took[res.instance] = append(took[res.instance], float64(res.took())/float64(time.Millisecond))
	}
	for i := range 2 {
		if len(took[i]) < 50 {
			t.Fatalf("only %d accepted reads on the %s instance", len(took[i]), instanceName[i])
		}
		p50[i], p99[i] = percentile(took[i], 0.50), percentile(took[i], 0.99)
		t.Logf("%s instance: %d accepted reads, p50 %.0f ms, p99 %.0f ms", instanceName[i], len(took[i]), p50[i], p99[i])
	}
	// Warmed up: the first reads also open the pool's connections, each
	// a few round trips over the slow link.
	first := oks[0].sent
	for _, res := range oks {
		if res.sent.Before(first) {
			first = res.sent
		}
	}
	var warm [2][]float64
	for _, res := range oks {
		if res.sent.After(first.Add(5 * time.Second)) {
			warm[res.instance] = append(warm[res.instance], float64(res.took())/float64(time.Millisecond))
		}
	}
	for i := range 2 {
		if len(warm[i]) > 0 {
			t.Logf("%s instance, after the first 5 s: %d accepted reads, p50 %.0f ms, p99 %.0f ms",
				instanceName[i], len(warm[i]), percentile(warm[i], 0.5), percentile(warm[i], 0.99))
		}
	}
	return p50, p99
}

// percentile is the q-quantile of v (nearest rank).
func percentile(v []float64, q float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)]
}
