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
// of one user, mostly refused past the rate) and over many keys (admitted).
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
}
