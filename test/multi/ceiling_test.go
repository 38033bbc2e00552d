package multi

import (
	"context"
	"sync"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// TestDailyRequestsAcrossInstances: 300 requests at once over two
// instances and 10 users, daily_requests = 30: the ceiling holds for the
// service, not per instance (at most 30 upstream calls, counted at the
// fake), nearly all of it is used, and every 200 has its usage row.
func TestDailyRequestsAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ceiling = 30
	p := newPair(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: ceiling}, 10, 20*time.Millisecond)
	rs := p.burst(ctx, 300)
	p.stopAll()
	_, upstream := p.gemini.Calls()
	got := len(ok(rs))
	t.Logf("300 requests over 2 instances: %v; %d upstream calls", tally(rs), upstream)
	if upstream > ceiling {
		t.Errorf("%d upstream calls, the ceiling is %d", upstream, ceiling)
	}
	if got < 25 {
		t.Errorf("%d successes, want at least 25 of the %d the ceiling allows\n%s", got, ceiling, p.logs())
	}
	b := readBooks(t, p.dbURL)
	checkRows(t, b, rs, upstream)
	if b.ledger.calls > ceiling {
		t.Errorf("the ledger counts %d calls, over the ceiling %d", b.ledger.calls, ceiling)
	}
}

// oneCallMicro is what one call costs at the fake's recorded usage
// (ocr/testdata/ok.json: 1,160 prompt tokens, 24+12 output tokens) at the
// shipped prices ($0.30 and $2.50 per million): 348 + 90 micro-dollars.
const oneCallMicro = 438

// TestDailyUSDAcrossInstances: the same with daily_usd as the only
// ceiling, set to 30 calls' worth: the money spent (at the fake, in the
// usage rows and in the ledger) never passes it. A client retries a
// budget_busy (calls in flight hold the rest at their worst case), as the
// API asks, so the ceiling is nearly used up.
func TestDailyUSDAcrossInstances(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ceilingMicro = 30 * oneCallMicro
	cfg := harness.Config{DailyRequests: 100000, DailyUSD: float64(ceilingMicro) / 1e6, MaxOutputTokens: 40}
	p := newPair(t, pgtest.NewDatabase(t), cfg, 10, 20*time.Millisecond)
	rs := p.burstRetrying(ctx, 300, "budget_busy")
	p.stopAll()
	_, upstream := p.gemini.Calls()
	got := len(ok(rs))
	t.Logf("300 requests over 2 instances: %v; %d upstream calls", tally(rs), upstream)
	if upstream*oneCallMicro > ceilingMicro {
		t.Errorf("%d upstream calls cost %d micro-dollars, the ceiling is %d", upstream, upstream*oneCallMicro, ceilingMicro)
	}
	if got < 25 {
		t.Errorf("%d successes, want at least 25 of the 30 the ceiling allows\n%s", got, p.logs())
	}
	b := readBooks(t, p.dbURL)
	checkRows(t, b, rs, upstream)
	if b.rowCount > 0 && b.rowMicro != b.rowCount*oneCallMicro {
		t.Errorf("%d usage rows cost %d micro-dollars, want %d each", b.rowCount, b.rowMicro, oneCallMicro)
	}
	if b.ledger.microUSD > ceilingMicro || b.ledger.settled > ceilingMicro {
		t.Errorf("the ledger holds %d micro-dollars (%d settled), over the ceiling %d", b.ledger.microUSD, b.ledger.settled, ceilingMicro)
	}
}

// burstRetrying is burst with each client retrying, after a short pause,
// an answer with the code retry (at most 200 times, within ctx).
func (p *pair) burstRetrying(ctx context.Context, n int, retry string) []result {
	client := burstClient(n)
	defer client.CloseIdleConnections()
	out := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			<-start
			for try := 0; ; try++ {
				out[k] = p.send(ctx, client, (k+try)%2, k%len(p.keys), nil)
				if out[k].answer.Code != retry || try >= 200 || ctx.Err() != nil {
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return out
}
