package budget

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// shareLog keeps what OnShare's fn was told, as "calls/µ$/month µ$".
type shareLog struct{ got []string }

func (s *shareLog) fn(c Counted) {
	s.got = append(s.got, fmt.Sprintf("%d/%d/%d", c.Requests, c.SpendMicroUSD, c.MonthMicroUSD))
}

func (s *shareLog) take() string {
	out := strings.Join(s.got, " ")
	s.got = nil
	return out
}

// The claim that takes a figure across a share tells the watcher before it
// returns, once per share: the 10th and 16th of 20 calls (50% and 80%),
// the money's own shares as they come, and nothing on the refused 21st. A
// new day arms every share again; a raised ceiling arms the shares the
// figure is now below; a Global started from the ledger (a restart) tells
// of the shares its figures already reach at its first claim.
func TestOnShareAtTheCrossing(t *testing.T) {
	cfg := Config{DailyRequests: 20, DailyUSD: 0.001} // 1,000 µ$
	l := newBook(cfg)
	g := mustGlobal(t, cfg, l, GlobalState{})
	log := &shareLog{}
	g.OnShare([]int64{80, 50}, log.fn)
	for i := 1; i <= 20; i++ {
		r, err := g.Claim(40, leaseNoon) // 40 µ$ each: 50% at the 13th call, 80% at the 20th
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if err := g.Commit(t.Context(), &r); err != nil {
			t.Fatal(err)
		}
		want := map[int]string{10: "10/400/400", 13: "13/520/520", 16: "16/640/640", 20: "20/800/800"}[i]
		if got := log.take(); got != want {
			t.Errorf("claim %d told %q, want %q", i, got, want)
		}
	}
	var pe *PausedError
	if _, err := g.Claim(40, leaseNoon); !errors.As(err, &pe) || pe.Ceiling != "daily_requests" {
		t.Fatalf("the 21st call: %v, want refused by daily_requests", err)
	}
	if got := log.take(); got != "" {
		t.Errorf("the refused call told %q", got)
	}

	// The next day (and month): 50% again at its 10th call.
	tomorrow := leaseNoon.AddDate(0, 0, 1)
	for i := 1; i <= 10; i++ {
		if _, err := g.Claim(0, tomorrow); err != nil {
			t.Fatal(err)
		}
	}
	if got := log.take(); got != "10/0/0" {
		t.Errorf("the next day told %q, want the 10th call", got)
	}
	// daily_requests raised to 40: 11 calls are below 50%, which is
	// armed again; 80% of 40 is the 32nd call.
	g.SetConfig(Config{DailyRequests: 40, DailyUSD: 0.001})
	for i := 11; i <= 32; i++ {
		if _, err := g.Claim(0, tomorrow); err != nil {
			t.Fatal(err)
		}
	}
	if got := log.take(); got != "20/0/0 32/0/0" {
		t.Errorf("after raising the ceiling, told %q, want the 20th and 32nd calls", got)
	}

	// A restart at 12 calls: the first claim tells of 50%.
	again := mustGlobal(t, cfg, l, GlobalState{Requests: 12})
	again.OnShare([]int64{50, 80}, log.fn)
	if _, err := again.Claim(0, leaseNoon); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); got != "13/0/0" {
		t.Errorf("after a restart, the first claim told %q, want 13/0/0", got)
	}
}

// On a shared ledger, the figures the brake decides on are every
// instance's: a top-up's answer that shows a share reached by another
// instance's calls tells this instance's watcher, and so does Refresh.
func TestOnShareFromTheSharedLedger(t *testing.T) {
	cfg := Config{DailyRequests: 200} // leases of 2 calls
	l := sharedBook{newBook(cfg)}
	a, b := mustGlobal(t, cfg, l, GlobalState{}), mustGlobal(t, cfg, l, GlobalState{})
	log := &shareLog{}
	b.OnShare([]int64{50, 80}, log.fn)
	for range 99 {
		call(t, a, l, 0, 0, leaseNoon)
	}
	call(t, b, l, 0, 0, leaseNoon) // B's top-up answers with A's 99 calls and A's lease
	if got := log.take(); got != "101/0/0" {
		t.Errorf("B's first call told %q, want the ledger's 102 calls (the unused leases in them) less B's own", got)
	}
	for range 60 {
		call(t, a, l, 0, 0, leaseNoon)
	}
	if err := b.Refresh(t.Context(), leaseNoon); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); got != "161/0/0" {
		t.Errorf("B's refresh told %q, want the ledger's 162 calls less B's unused lease", got)
	}
	l.assertClean(t)
}

// ShareOf is the share of a limit rounded up, exactly, where a float
// product would not be (0.8 × 20 is not 16 in binary), and without
// overflow near the largest limits.
func TestShareOf(t *testing.T) {
	for _, tc := range []struct{ percent, limit, want int64 }{
		{80, 20, 16}, {50, 20, 10}, {95, 20, 19}, {50, 1, 1}, {1, 1, 1}, {99, 100, 99},
		{33, 10, 4}, {29, 1_000_000, 290_000}, {50, math.MaxInt64, math.MaxInt64/2 + 1},
	} {
		if got := ShareOf(tc.percent, tc.limit); got != tc.want {
			t.Errorf("ShareOf(%d, %d) = %d, want %d", tc.percent, tc.limit, got, tc.want)
		}
	}
}
