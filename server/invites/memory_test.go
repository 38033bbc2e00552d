package invites

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"breakwater/limiter"
)

// perIPBudget is the live heap one client IP may cost the invite limits
// after one wrong guess: its rate window, and the fail limiter's entries
// for its IP and its e-mail. The target is 1 KiB of RSS per IP,
// and RSS runs to about twice the live heap under the default GOGC.
const perIPBudget = 245

// limitsPerIP feeds the limits n wrong guesses, each from an IP and an
// e-mail of its own, as POST /v1/invites/verify does, and returns the live
// heap they hold, per IP, with the write-behind's Dirty called every
// 10,000 guesses as it is every second.
func limitsPerIP(tb testing.TB, n int) float64 {
	tb.Helper()
	g, err := NewLimits(Config{GlobalFailPerHour: 1 << 30})
	if err != nil {
		tb.Fatal(err)
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	g.Windows.Dirty(at)
	g.Fails.Dirty()
	before := liveHeap()
	for i := range n {
		ip := "ip:" + limiter.ClientKey(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
		if err := g.Windows.Allow(ip, at); err != nil {
			tb.Fatal(err)
		}
		a, err := g.Fails.Begin([]string{ip, fmt.Sprintf("email:guess-%d@example.com", i)}, at)
		if err != nil {
			tb.Fatal(err)
		}
		a.Fail(at)
		if i%10_000 == 9_999 {
			g.Windows.Dirty(at)
			g.Fails.Dirty()
		}
	}
	g.Windows.Dirty(at)
	g.Fails.Dirty()
	after := liveHeap()
	if g.Windows.Len() != n || g.Fails.Len() != 2*n {
		tb.Fatalf("held %d windows and %d fail keys, want %d and %d", g.Windows.Len(), g.Fails.Len(), n, 2*n)
	}
	runtime.KeepAlive(g)
	return float64(after-before) / float64(n)
}

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestGuardMemoryPerIP: 100,000 client IPs, one wrong guess each, hold at
// most perIPBudget bytes of live heap each. A memory figure, not a timing
// gate.
func TestGuardMemoryPerIP(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 guesses")
	}
	per := limitsPerIP(t, 100_000)
	t.Logf("100,000 client IPs: %.0f bytes of live heap each", per)
	if per > perIPBudget {
		t.Errorf("%.0f bytes of live heap per client IP, want at most %d", per, perIPBudget)
	}
}

// BenchmarkGuardMemoryPerIP reports the live heap per client IP (B/IP)
// over 100,000 of them, to follow the figure; its time means nothing.
func BenchmarkGuardMemoryPerIP(b *testing.B) {
	var per float64
	for range b.N {
		per = limitsPerIP(b, 100_000)
	}
	b.ReportMetric(per, "B/IP")
	b.ReportMetric(0, "ns/op")
}
