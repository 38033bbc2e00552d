package detect_test

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage"
)

var memEvents = flag.Int("detect.events", 0, "TestRunMemoryIsBounded: run one day of this many events (for example 1000000) instead of the N and 10N pair")

// floodEvent is event i of a day under attack, as older versions stored
// it: nine in ten are invite refusals, each from its own IPv6 /64 with
// its own e-mail, the rest OCR attempts of 50 users.
func floodEvent(at time.Time, i int) detect.Event {
	t := at.Add(time.Duration(i) * time.Millisecond)
	ip := fmt.Sprintf("2001:db8:%x:%x::1", i>>16, i&0xffff)
	if i%10 == 0 {
		return detect.Event{Time: t, UserID: fmt.Sprintf("user%d", i%50), IP: ip, Route: "/v1/ocr", Outcome: "ok", Bytes: 40_000, CostMicroUSD: 120}
	}
	return detect.Event{Time: t, UserID: fmt.Sprintf("guess%d@example.com", i), IP: ip, Route: detect.RouteInvite, Outcome: "invalid", Status: 403}
}

// fillDay writes n flood events into a fresh database file, from day's
// first instant.
func fillDay(t *testing.T, at time.Time, n int) *storage.DB {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "d.db"), storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	batch := make([]detect.Event, 0, 10_000)
	for i := range n {
		batch = append(batch, floodEvent(at, i))
		if len(batch) == cap(batch) || i == n-1 {
			if err := db.AppendEvents(batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	return db
}

// peakHeapDuring runs fn while a goroutine samples the bytes of live and
// not yet swept heap objects, and returns the highest sample above the
// figure before fn, after a collection.
func peakHeapDuring(fn func()) uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	runtime.GC()
	base := read()
	peak := base
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, read())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(stop)
	<-done
	peak = max(peak, read())
	return peak - base
}

// TestRunMemoryIsBounded runs a day of N and of 10N events stored in a
// real database file and checks that the peak heap of the run does not
// grow with the number of events: a run streams the events and keeps at
// most max_keys IPs and e-mails. With -detect.events=1000000 it runs one
// day of a million events instead and checks the absolute bound.
func TestRunMemoryIsBounded(t *testing.T) {
	const (
		bound  = 48 << 20 // most heap a run may add, whatever the day holds
		growth = 8 << 20  // most the peak may grow from N to 10N events
	)
	day := time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)
	run := func(n int) uint64 {
		db := fillDay(t, day, n)
		r, err := detect.NewRunner(db, detect.RunnerOptions{Location: time.UTC, Now: func() time.Time { return day.AddDate(0, 0, 1) }})
		if err != nil {
			t.Fatal(err)
		}
		var rep detect.Report
		peak := peakHeapDuring(func() {
			rep, err = r.Run(context.Background(), "2026-03-08", false)
		})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := rep.Service.Attempts+rep.Service.Invites, int64(n); got != want {
			t.Fatalf("%d events: the run counted %d", n, got)
		}
		t.Logf("%d events: peak heap +%.1f MiB", n, float64(peak)/(1<<20))
		if peak > bound {
			t.Errorf("%d events: the run's heap grew by %.1f MiB, more than %d MiB", n, float64(peak)/(1<<20), bound>>20)
		}
		return peak
	}
	if *memEvents > 0 {
		run(*memEvents)
		return
	}
	n := 10_000
	small, large := run(n), run(10*n)
	if large > small+growth {
		t.Errorf("peak heap %.1f MiB at %d events and %.1f MiB at %d: it grows with the events", float64(small)/(1<<20), n, float64(large)/(1<<20), 10*n)
	}
}
