package detect_test

import (
	"context"
	"testing"
	"time"

	"breakwater/detect"
)

// Refusals by a layer are stored as one row per minute and key, at most
// RefusalKeys keys a minute (the rest under Other), and still sum to
// every refusal; the daily aggregate counts none of them as attempts.
func TestRecorderTalliesLayerRefusalsPerMinute(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	close(w.release)
	var rows []detect.Event
	capture := writerFunc(func(events []detect.Event) error {
		rows = append(rows, events...)
		return w.AppendEvents(events)
	})
	r := detect.NewRecorder(capture, detect.RecorderOptions{RefusalKeys: 10, QueueSize: 20_000})
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := range 3000 {
		user := "u" + string(rune('a'+i%100)) // 100 users
		at := t0.Add(time.Duration(i) * 30 * time.Millisecond)
		r.Record(detect.Event{Time: at, UserID: user, IP: "2001:db8::1", Route: "/v1/ocr", Layer: "rate", Outcome: detect.OutcomeLayerRefused})
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var sum int64
	minutes := map[time.Time]int{}
	agg := detect.NewAggregator("2026-12-01", detect.Lines{}, 0)
	for _, e := range rows {
		agg.Add(e)
		if e.Outcome != detect.OutcomeLayerRefused {
			continue
		}
		sum += e.N()
		minutes[e.Time]++
		if e.UserID != detect.Other && e.IP != "2001:db8::/64" {
			t.Errorf("row %+v keeps the IP, not its /64", e)
		}
	}
	if sum != 3000 {
		t.Errorf("rows sum to %d, want 3000", sum)
	}
	if len(minutes) != 2 { // 3000 * 30ms = 90s: two minutes
		t.Errorf("rows in %d minutes, want 2", len(minutes))
	}
	for m, n := range minutes {
		if n > 11 {
			t.Errorf("minute %s has %d rows, want at most 10 keys + other", m, n)
		}
	}
	if s := agg.Done(); s.Service.Attempts != 0 {
		t.Errorf("the aggregate counts %d attempts from refusal rows, want 0", s.Service.Attempts)
	}
}

type writerFunc func([]detect.Event) error

func (f writerFunc) AppendEvents(events []detect.Event) error { return f(events) }

// PendingRefusals gives the minute of refusals still counted in memory,
// as the rows it will be stored as, and nothing once they are stored:
// stored and pending together are every refusal, once.
func TestRecorderPendingRefusals(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC)
	stored := make(chan []detect.Event, 16)
	r := detect.NewRecorder(writerFunc(func(events []detect.Event) error { stored <- events; return nil }),
		detect.RecorderOptions{Now: func() time.Time { return now }})
	for range 4 {
		r.Record(detect.Event{Time: now, UserID: "sam", Route: "/v1/ocr", Layer: "rate", Outcome: detect.OutcomeShadowRefused})
	}
	sum := func(rows []detect.Event) (n int64) {
		for _, e := range rows {
			if e.UserID == "sam" && e.Outcome == detect.OutcomeShadowRefused {
				n += e.N()
			}
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for sum(r.PendingRefusals()) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("pending refusals %v, want 4 of sam's", r.PendingRefusals())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(stored)
	var all []detect.Event
	for rows := range stored {
		all = append(all, rows...)
	}
	if got := sum(all); got != 4 {
		t.Errorf("stored %d of sam's refusals, want 4", got)
	}
	if got := r.PendingRefusals(); len(got) != 0 {
		t.Errorf("pending after they were stored: %v", got)
	}
}

// Reads answered from storage are stored as one row per minute and key
// (RefusalKeys keys a minute apart from the refusals, the rest under
// Other), with the key's status; the daily aggregate counts every answer,
// per user and for the service, and none as an attempt.
func TestRecorderTalliesCachedAnswersPerMinute(t *testing.T) {
	var rows []detect.Event
	capture := writerFunc(func(events []detect.Event) error {
		rows = append(rows, events...)
		return nil
	})
	r := detect.NewRecorder(capture, detect.RecorderOptions{RefusalKeys: 10, QueueSize: 20_000})
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := range 3000 {
		user := "u" + string(rune('a'+i%20)) // 20 users
		outcome := detect.OutcomeCached
		if i%3 == 0 {
			outcome = detect.OutcomeReplayed
		}
		at := t0.Add(time.Duration(i) * 30 * time.Millisecond)
		r.Record(detect.Event{Time: at, UserID: user, KeyID: "k" + user, Plan: "free", IP: "192.0.2.1", Route: "/v1/ocr", Outcome: outcome, Status: 200})
		// A refusal flood beside them takes none of their rows.
		r.Record(detect.Event{Time: at, UserID: "x" + user, IP: "192.0.2.2", Route: "/v1/ocr", Layer: "rate", Outcome: detect.OutcomeLayerRefused})
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	agg := detect.NewAggregator("2026-12-01", detect.Lines{}, 0)
	var sum int64
	answerRows := 0
	for _, e := range rows {
		agg.Add(e)
		if e.Outcome != detect.OutcomeCached && e.Outcome != detect.OutcomeReplayed {
			continue
		}
		answerRows++
		sum += e.N()
		if e.UserID != detect.Other && (e.Status != 200 || e.KeyID != "k"+e.UserID || e.Plan != "free" || !e.Time.Equal(e.Time.Truncate(time.Minute))) {
			t.Errorf("row %+v lost what its events had", e)
		}
	}
	if sum != 3000 {
		t.Errorf("rows of answers sum to %d, want 3000", sum)
	}
	// Two minutes, two outcomes: at most 10 keys and Other each, of 40
	// keys a minute.
	if answerRows > 2*2*11 {
		t.Errorf("%d rows of answers, want at most %d", answerRows, 2*2*11)
	}
	s := agg.Done()
	if s.Service.Cached != 3000 || s.Service.Attempts != 0 {
		t.Errorf("the aggregate counts %d cached and %d attempts, want 3000 and 0", s.Service.Cached, s.Service.Attempts)
	}
	var perUser int64
	for user, u := range s.Users {
		if user == detect.Other {
			t.Errorf("the row of Other counted as a user: %+v", u)
		}
		perUser += u.Cached
	}
	if perUser == 0 || perUser > 3000 {
		t.Errorf("users count %d cached answers, want some and at most 3000", perUser)
	}
}
