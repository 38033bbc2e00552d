package admin

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/server/edgetest"
)

func TestAdminNeedsToken(t *testing.T) {
	e := newTestAdmin(t, adminOptions{})
	for _, token := range []string{"", "wrong", testAdminToken + "x", e.key} {
		resp, data := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/keys", token))
		edgetest.DecodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")
	}
	resp, _ := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/keys", testAdminToken))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}

// GET /api/recorded streams the events of the range, across the store's
// pages, in time order, then the findings, and ends with their counts;
// a range out of order is 400.
func TestRecordedThroughAdminClient(t *testing.T) {
	e := newTestAdmin(t, adminOptions{})
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	var events []detect.Event
	for i := range 5000 {
		events = append(events, detect.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), UserID: fmt.Sprintf("u%d", i%7), Route: "/v1/ocr", Outcome: "ok", Count: int64(i % 3)})
	}
	if err := e.db.AppendEvents(events); err != nil {
		t.Fatal(err)
	}
	finding := detect.Finding{Day: "2026-11-20", Detector: "rate", Subject: "u3", Figures: map[string]float64{"attempts": 9}}
	if err := e.db.SaveDetection(detect.DayStats{Day: "2026-11-20"}, []detect.Finding{finding}, detect.RunRecord{Day: "2026-11-20"}); err != nil {
		t.Fatal(err)
	}
	var got []detect.Event
	findings, err := adminClient(e).EachRecorded(context.Background(), t0.Add(time.Second), t0.Add(4*time.Second), func(ev detect.Event) error {
		got = append(got, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := events[1000:4000]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%d events, want the %d of the range in order", len(got), len(want))
	}
	if len(findings) != 1 || findings[0].Subject != "u3" || findings[0].Figures["attempts"] != 9 {
		t.Errorf("findings %+v", findings)
	}
	resp, data := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/recorded?from=2026-11-21T00:00:00Z&to=2026-11-20T00:00:00Z", testAdminToken))
	edgetest.DecodeProblem(t, resp, data, http.StatusBadRequest, "bad_request")
}
