package limiter_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/limiter"
)

// BenchmarkAllow measures the admitted path on an existing key with a full
// history: every request replaces the oldest of 100.
func BenchmarkAllow(b *testing.B) {
	const rate = 100
	l := mustNew(b, limiter.Config{Rate: rate, Window: time.Minute, Burst: 10})
	step := time.Minute/rate + time.Millisecond // whole microseconds: stored exactly
	for i := range rate {
		if err := l.Allow("user-1", t0.Add(time.Duration(i)*step)); err != nil {
			b.Fatal(err)
		}
	}
	now := t0.Add(rate * step)
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Allow("user-1", now); err != nil {
			b.Fatal(err)
		}
		now = now.Add(step)
	}
}

// BenchmarkAllowRefused measures the refused path: a key at its limit.
func BenchmarkAllowRefused(b *testing.B) {
	const rate = 100
	l := mustNew(b, limiter.Config{Rate: rate, Window: time.Minute})
	for range rate {
		if err := l.Allow("user-1", t0); err != nil {
			b.Fatal(err)
		}
	}
	now := t0.Add(time.Second)
	b.ReportAllocs()
	for b.Loop() {
		if l.Allow("user-1", now) == nil {
			b.Fatal("admitted over the limit")
		}
	}
}

// BenchmarkAllowParallel measures Allow from all CPUs across many keys: a
// thousand (hot in cache) and a hundred thousand (mostly cache misses).
func BenchmarkAllowParallel(b *testing.B) {
	for _, keys := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			l := mustNew(b, limiter.Config{Rate: 100, Window: time.Minute, Burst: 10})
			names := make([]string, keys)
			for i := range names {
				names[i] = fmt.Sprintf("user-%d", i)
				_ = l.Allow(names[i], t0)
			}
			var (
				worker   atomic.Int64
				admitted atomic.Int64
			)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(worker.Add(1) * 7919)
				now := t0
				n := int64(0)
				for pb.Next() {
					if l.Allow(names[i%keys], now) == nil {
						n++
					}
					i++
					now = now.Add(time.Millisecond)
				}
				admitted.Add(n)
			})
			b.ReportMetric(float64(admitted.Load())/float64(b.N), "admitted/op")
		})
	}
}

// BenchmarkMemoryPerKey reports the heap held per active key at Rate 100
// with a full history, over 100k keys.
func BenchmarkMemoryPerKey(b *testing.B) {
	const (
		keys = 100_000
		rate = 100
	)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("user-%d", i)
	}
	var perKey float64
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		l := mustNew(b, limiter.Config{Rate: rate, Window: time.Minute})
		for r := range rate {
			now := t0.Add(time.Duration(r) * 500 * time.Millisecond)
			for _, k := range names {
				if err := l.Allow(k, now); err != nil {
					b.Fatal(err)
				}
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got, want := l.Len(), keys; got != want {
			b.Fatalf("Len() = %d, want %d", got, want)
		}
		perKey = float64(after.HeapAlloc-before.HeapAlloc) / keys
		runtime.KeepAlive(l)
	}
	b.ReportMetric(perKey, "B/key")
	b.ReportMetric(0, "ns/op")
}
