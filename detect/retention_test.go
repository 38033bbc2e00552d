package detect_test

import (
	"context"
	"testing"
	"time"

	"breakwater/detect"
)

// The daily run applies storage.stats_retention_days to the personal data
// outside the raw events too: an aggregate past retention loses its IPs
// and e-mails, and its findings go.
func TestDailyRunPrunesPersonalDataPastRetention(t *testing.T) {
	db := mustOpen(t)
	at := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	old := "2026-02-01"
	stats := detect.DayStats{Day: old, Users: map[string]detect.UserDay{"u1": {}}, IPs: map[string]detect.IPDay{"192.0.2.1": {}},
		Emails: map[string]detect.IPDay{"someone@example.com": {}}}
	if err := db.SaveDetection(stats, []detect.Finding{{Day: old, Detector: "invite_bruteforce", Subject: "someone@example.com"}}, detect.RunRecord{Day: old}); err != nil {
		t.Fatal(err)
	}
	if err := db.AppendEvents([]detect.Event{{Time: at, UserID: "u1", IP: "192.0.2.7", Route: "/v1/ocr", Outcome: "ok"}}); err != nil {
		t.Fatal(err)
	}
	r, err := detect.NewRunner(db, detect.RunnerOptions{Location: time.UTC, RetentionDays: 30, Now: func() time.Time { return at.AddDate(0, 0, 1) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), "2026-03-08", false); err != nil {
		t.Fatal(err)
	}
	got, err := db.DayStats(old, old)
	if err != nil || len(got) != 1 {
		t.Fatalf("DayStats(%s) = %v, %v", old, got, err)
	}
	if got[0].IPs != nil || got[0].Emails != nil {
		t.Errorf("an aggregate 36 days old keeps IPs %v and e-mails %v past a retention of 30 days", got[0].IPs, got[0].Emails)
	}
	if f, err := db.Findings(old, old); err != nil || len(f) != 0 {
		t.Errorf("findings 36 days old: %v %v, want none", f, err)
	}
}
