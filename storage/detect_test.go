package storage

import (
	"errors"
	"testing"
	"time"

	"breakwater/detect"
)

func TestSaveDetectionReplacesTheDay(t *testing.T) {
	db := mustOpen(t)
	if _, err := db.LastDetectRun(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("LastDetectRun on a new database = %v, want ErrNotFound", err)
	}
	day := detect.DayStats{Day: "2026-03-08", Users: map[string]detect.UserDay{"u": {Attempts: 3}}}
	first := []detect.Finding{{Day: day.Day, Detector: "spike", Subject: "u"}, {Day: day.Day, Detector: "failures", Subject: "u"}}
	if err := db.SaveDetection(day, first, detect.RunRecord{Day: day.Day, Findings: 2}); err != nil {
		t.Fatal(err)
	}
	day.Users["u"] = detect.UserDay{Attempts: 4}
	if err := db.SaveDetection(day, first[:1], detect.RunRecord{Day: day.Day, Findings: 1}); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveDetection(detect.DayStats{Day: "2026-03-07"}, nil, detect.RunRecord{Day: "2026-03-07"}); err != nil {
		t.Fatal(err)
	}
	stats, err := db.DayStats("2026-03-01", "2026-03-31")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(stats), 2; got != want {
		t.Fatalf("%d aggregates, want %d", got, want)
	}
	if got, want := stats[1].Users["u"].Attempts, int64(4); stats[1].Day != "2026-03-08" || got != want {
		t.Errorf("second aggregate %s attempts %d, want 2026-03-08 and %d", stats[1].Day, got, want)
	}
	findings, err := db.Findings("2026-03-08", "2026-03-08")
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) != 1 || findings[0].Detector != "spike" {
		t.Errorf("findings after re-run = %+v, want the one spike", findings)
	}
	run, err := db.LastDetectRun()
	if err != nil || run.Day != "2026-03-08" || run.Findings != 1 {
		t.Errorf("LastDetectRun = %+v, %v; want 2026-03-08 with 1 finding", run, err)
	}
	if err := db.SaveDetection(detect.DayStats{Day: "8 March"}, nil, detect.RunRecord{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad day: %v, want ErrInvalid", err)
	}
}

func TestPruneEvents(t *testing.T) {
	db := mustOpen(t)
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var events []detect.Event
	for i := range 10 {
		events = append(events, detect.Event{Time: base.Add(time.Duration(i) * time.Hour), Route: "/v1/ocr"})
	}
	if err := db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	n, err := db.PruneEvents(base.Add(4 * time.Hour))
	if err != nil || n != 4 {
		t.Fatalf("PruneEvents = %d, %v; want 4, nil", n, err)
	}
	left, _ := db.Events(time.Time{}, time.Time{})
	if len(left) != 6 || !left[0].Time.Equal(base.Add(4*time.Hour)) {
		t.Errorf("%d events left starting %v, want 6 from 04:00", len(left), left[0].Time)
	}

	// More than one transaction's worth.
	many := make([]detect.Event, 2*prunePage+5)
	for i := range many {
		many[i] = detect.Event{Time: base.Add(-time.Duration(i+1) * time.Second), Route: "/v1/ocr"}
	}
	if err := db.AppendEvents(many); err != nil {
		t.Fatal(err)
	}
	if n, err := db.PruneEvents(base.Add(5 * time.Hour)); err != nil || n != len(many)+1 {
		t.Fatalf("PruneEvents = %d, %v; want %d, nil", n, err, len(many)+1)
	}
}

func TestAlertStates(t *testing.T) {
	db := mustOpen(t)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, st := range []detect.AlertState{{Kind: "brake_engaged", SentAt: at}, {Kind: "usage_commit_failed", SentAt: at}, {Kind: "brake_engaged", SentAt: at.Add(time.Hour)}} {
		if err := db.SaveAlertState(st); err != nil {
			t.Fatal(err)
		}
	}
	states, err := db.AlertStates()
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 2 || states[0].Kind != "brake_engaged" || !states[0].SentAt.Equal(at.Add(time.Hour)) {
		t.Errorf("AlertStates = %+v, want brake_engaged at 13:00 and usage_commit_failed", states)
	}
	if err := db.SaveAlertState(detect.AlertState{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("no kind: %v, want ErrInvalid", err)
	}
}

// TestDetectRunAttempts: a started run counts until it is saved, given
// up or ended; a crash (nothing after the start) leaves the count.
func TestDetectRunAttempts(t *testing.T) {
	db := mustOpen(t)
	const day = "2026-03-08"
	for want := range 3 { // three starts, as three crashed runs leave them
		if got, err := db.StartDetectRun(day); err != nil || got != want {
			t.Fatalf("StartDetectRun #%d = %d, %v; want %d earlier unfinished runs", want+1, got, err, want)
		}
	}
	if got, _ := db.StartDetectRun("2026-03-09"); got != 0 {
		t.Errorf("another day starts with %d unfinished runs, want 0", got)
	}
	if err := db.EndDetectRun(day); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.StartDetectRun(day); got != 0 {
		t.Errorf("after EndDetectRun: %d unfinished runs, want 0", got)
	}
	if err := db.SaveDetection(detect.DayStats{Day: day}, nil, detect.RunRecord{Day: day}); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.StartDetectRun(day); got != 0 {
		t.Errorf("after SaveDetection: %d unfinished runs, want 0", got)
	}
	gaveUp := detect.Finding{Day: "2026-03-09", Detector: "detection_gave_up", Subject: "service"}
	if err := db.SaveDetectRun(detect.RunRecord{Day: "2026-03-09", GaveUp: true}, []detect.Finding{gaveUp}); err != nil {
		t.Fatal(err)
	}
	if run, err := db.LastDetectRun(); err != nil || run.Day != "2026-03-09" || !run.GaveUp {
		t.Errorf("LastDetectRun = %+v, %v; want 2026-03-09 given up", run, err)
	}
	if f, _ := db.Findings("2026-03-09", "2026-03-09"); len(f) != 1 || f[0].Detector != "detection_gave_up" {
		t.Errorf("findings of the day given up: %+v", f)
	}
	if got, _ := db.StartDetectRun("2026-03-09"); got != 0 {
		t.Errorf("after SaveDetectRun: %d unfinished runs, want 0", got)
	}
	if _, err := db.StartDetectRun("8 March"); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad day: %v, want ErrInvalid", err)
	}
}
