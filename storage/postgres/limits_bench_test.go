package postgres_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/limiter"
	"breakwater/storage/postgres/pgtest"
)

// BenchmarkWindowsTake is one shared window decision, its own round trip
// and transaction, from 16 goroutines: over one key's row (every request
// of one user, mostly refused past the rate) and over many keys
// (admitted); and, from one goroutine, over one key whose log already
// holds 10 or 10,000 live entries (admitted).
//
//	go test -run '^$' -bench WindowsTake -benchtime 2000x ./storage/postgres
func BenchmarkWindowsTake(b *testing.B) {
	for _, keys := range []int{1, 1000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			w := openInstance(b, pgtest.NewDatabase(b)).db.Limits().Windows("user")
			cfg := limiter.Config{Rate: 60, Window: time.Minute, Burst: 5}
			var n atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					if _, err := w.Take(fmt.Sprintf("user-%d", i%int64(keys)), cfg, time.Now()); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	// One key whose log holds live entries (admitted within the last
	// hour, under a rate far above them): each decision, one at a time,
	// admits one more, and costs the same whatever the log's length.
	for _, live := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			w := openInstance(b, pgtest.NewDatabase(b)).db.Limits().Windows("user")
			cfg := limiter.Config{Rate: limiter.MaxRate, Window: limiter.MaxWindow}
			start := time.Now()
			for i := range live {
				if r, err := w.Take("heavy", cfg, start.Add(time.Duration(i-live)*time.Millisecond)); r != nil || err != nil {
					b.Fatalf("preloading entry %d: %v, %v", i, r, err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if r, err := w.Take("heavy", cfg, time.Now()); r != nil || err != nil {
					b.Fatalf("Take = %v, %v; want admitted", r, err)
				}
			}
		})
	}
}
