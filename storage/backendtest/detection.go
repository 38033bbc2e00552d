package backendtest

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"breakwater/detect"
)

// Detection checks the detection half of detect.Store and
// detect.AlertStore: a day's aggregate, findings and run saved together
// and replaced by a re-run, the count of unfinished runs, alert states.
func Detection(t *testing.T, kit Kit) {
	t.Run("SaveDetectionReplacesTheDay", func(t *testing.T) { saveDetection(t, kit) })
	t.Run("DetectRunAttempts", func(t *testing.T) { detectRunAttempts(t, kit) })
	t.Run("AlertStates", func(t *testing.T) { alertStates(t, kit) })
}

// saveDetection: a re-run of a day replaces its aggregate, findings and
// run; aggregates and findings round-trip exactly; a bad day is refused.
func saveDetection(t *testing.T, kit Kit) {
	db := kit.Open(t)
	if _, err := db.LastDetectRun(); !errors.Is(err, detect.ErrNoRun) {
		t.Fatalf("LastDetectRun on a new database = %v, want detect.ErrNoRun", err)
	}
	day := detect.DayStats{Day: "2026-03-08", Users: map[string]detect.UserDay{"u": {Attempts: 3}},
		IPs: map[string]detect.IPDay{"192.0.2.1": {}}}
	first := []detect.Finding{{Day: day.Day, Detector: "spike", Subject: "u", Figures: map[string]float64{"ratio": 0.1 + 0.2}},
		{Day: day.Day, Detector: "failures", Subject: "u"}}
	if err := db.SaveDetection(day, first, detect.RunRecord{Day: day.Day, Findings: 2}); err != nil {
		t.Fatal(err)
	}
	day.Users["u"] = detect.UserDay{Attempts: 4}
	if err := db.SaveDetection(day, first[:1], detect.RunRecord{Day: day.Day, Findings: 1, RanAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveDetection(detect.DayStats{Day: "2026-03-07"}, nil, detect.RunRecord{Day: "2026-03-07"}); err != nil {
		t.Fatal(err)
	}
	stats, err := db.DayStats("2026-03-01", "2026-03-31")
	if err != nil || len(stats) != 2 || stats[0].Day != "2026-03-07" {
		t.Fatalf("DayStats = %+v, %v; want 03-07 and 03-08", stats, err)
	}
	if !reflect.DeepEqual(stats[1], day) {
		t.Errorf("aggregate round trip = %+v, want %+v", stats[1], day)
	}
	if all, _ := db.DayStats("2026-03-08", ""); len(all) != 1 {
		t.Errorf("DayStats to the last = %d days, want 1", len(all))
	}
	findings, err := db.Findings("2026-03-08", "2026-03-08")
	if err != nil || len(findings) != 1 || !reflect.DeepEqual(findings[0], first[0]) {
		t.Errorf("findings after re-run = %+v, %v; want the one spike, figures exact", findings, err)
	}
	run, err := db.LastDetectRun()
	if err != nil || run.Day != "2026-03-08" || run.Findings != 1 || !run.RanAt.Equal(t0) {
		t.Errorf("LastDetectRun = %+v, %v; want 2026-03-08 with 1 finding", run, err)
	}
	if err := db.SaveDetection(detect.DayStats{Day: "8 March"}, nil, detect.RunRecord{}); !errors.Is(err, kit.ErrInvalid) {
		t.Errorf("bad day: %v, want ErrInvalid", err)
	}
}

// detectRunAttempts: a started run counts until it is saved, given up or
// ended; a crash (nothing after the start) leaves the count.
func detectRunAttempts(t *testing.T, kit Kit) {
	db := kit.Open(t)
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
	if _, err := db.StartDetectRun("8 March"); !errors.Is(err, kit.ErrInvalid) {
		t.Errorf("bad day: %v, want ErrInvalid", err)
	}
}

// alertStates: one state per kind, the last saved kept with its summary,
// listed by kind; a state without kind is refused.
func alertStates(t *testing.T, kit Kit) {
	db := kit.Open(t)
	for _, st := range []detect.AlertState{{Kind: "usage_commit_failed", SentAt: t0}, {Kind: "brake_engaged", SentAt: t0},
		{Kind: "brake_engaged", SentAt: t0.Add(time.Hour), Summary: "again"}} {
		if err := db.SaveAlertState(st); err != nil {
			t.Fatal(err)
		}
	}
	states, err := db.AlertStates()
	if err != nil || len(states) != 2 || states[0].Kind != "brake_engaged" || !states[0].SentAt.Equal(t0.Add(time.Hour)) ||
		states[0].Summary != "again" || states[1].Kind != "usage_commit_failed" || !states[1].SentAt.Equal(t0) {
		t.Errorf("AlertStates = %+v, %v; want brake_engaged at 13:00 (again), then usage_commit_failed at 12:00", states, err)
	}
	if err := db.SaveAlertState(detect.AlertState{}); !errors.Is(err, kit.ErrInvalid) {
		t.Errorf("no kind: %v, want ErrInvalid", err)
	}
}
