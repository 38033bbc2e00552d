package admin

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
)

// fakeServiceRefusals is the shared database's sum of every instance's
// refusals, counting its reads.
type fakeServiceRefusals struct {
	mu    sync.Mutex
	reads int
	rows  []detect.LayerRefusals
	err   error
}

func (f *fakeServiceRefusals) LayerRefusals(from, to time.Time) ([]detect.LayerRefusals, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.rows, f.err
}

func (f *fakeServiceRefusals) set(rows []detect.LayerRefusals, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows, f.err = rows, err
}

func (f *fakeServiceRefusals) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// With other instances, /metrics and the dashboard show the service's
// refusals beside the instance's own, under names of their own; the sum is
// read at most once per serviceRefusalsTTL, and a failed read leaves the
// series out and says so on the dashboard.
func TestServiceRefusalsBesideTheInstances(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	svc := &fakeServiceRefusals{rows: []detect.LayerRefusals{
		{Layer: "budget", Count: 1}, {Layer: "rate", Count: 12}, {Layer: "rate", Shadow: true, Count: 2},
	}}
	var logs syncBuffer
	e := newTestAdmin(t, adminOptions{clock: clock, service: svc, logTo: &logs})
	// The public API starts the instance's own series at zero.
	e.edge.Metrics().StartRefusals(map[string][]string{"rate": {"rate"}})

	m := scrape(t, e)
	for _, want := range []string{
		`breakwater_service_refusals_today{layer="rate"} 12`,
		`breakwater_service_refusals_today{layer="budget"} 1`,
		`breakwater_service_shadow_refusals_today{layer="rate"} 2`,
		`breakwater_refusals_total{layer="rate",reason="rate"} 0`, // the instance's own, unchanged
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	resp, page := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", testAdminToken))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %d", resp.StatusCode)
	}
	if !strings.Contains(string(page), `id="service-refusals"`) || !strings.Contains(string(page), `<td>rate</td><td class="n">12</td></tr>`) {
		t.Errorf("the dashboard lacks the service's refusals:\n%s", page)
	}
	if got := svc.count(); got != 1 {
		t.Errorf("%d reads of the service's refusals for a scrape and a dashboard within %v, want 1", got, serviceRefusalsTTL)
	}

	mu.Lock()
	now = now.Add(serviceRefusalsTTL)
	mu.Unlock()
	svc.set(nil, errors.New("database unreachable"))
	if m := scrape(t, e); strings.Contains(m, "breakwater_service_refusals_today{") {
		t.Error("/metrics shows the service's refusals it could not read")
	}
	if got := svc.count(); got != 2 {
		t.Errorf("%d reads after %v, want 2", got, serviceRefusalsTTL)
	}
	_, page = do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", testAdminToken))
	if !strings.Contains(string(page), `id="service-refusals-error"`) {
		t.Errorf("the dashboard does not say the service's refusals are missing:\n%s", page)
	}
	if logs := logs.String(); strings.Count(logs, "the service's refusals not read") != 1 {
		t.Errorf("want one log line of the failed read:\n%s", logs)
	}
}

// One instance (bolt): no service series, no service table.
func TestNoServiceRefusalsOnOneInstance(t *testing.T) {
	e := newTestAdmin(t, adminOptions{})
	if m := scrape(t, e); strings.Contains(m, "breakwater_service_") {
		t.Error("/metrics of one instance has service series")
	}
	_, page := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/", testAdminToken))
	if strings.Contains(string(page), `id="service-refusals"`) {
		t.Error("the dashboard of one instance has the service's table")
	}
}

// syncBuffer is a log buffer concurrent writes share.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
