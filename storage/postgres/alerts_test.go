package postgres_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"breakwater/detect"
)

// Instances that raise the same alert at once, each on its own
// connection pool: exactly one claim wins, every round.
func TestClaimAlertOneWinnerAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	dbs := [2]interface {
		ClaimAlert(detect.AlertState, time.Time) (bool, detect.AlertState, error)
	}{open(t, url), open(t, url)}
	t0 := time.Date(2026, 3, 4, 9, 0, 0, 0, time.UTC)
	const rounds, perInstance = 5, 4
	for round := range rounds {
		// Each round is a new hour: min_interval (1h) lets one through.
		at := t0.Add(time.Duration(round) * time.Hour)
		var wins sync.Map
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 * perInstance {
			wg.Go(func() {
				<-start
				st := detect.AlertState{Kind: detect.KindBrakeEngaged, SentAt: at.Add(time.Duration(i) * time.Millisecond), Summary: "brake", Period: "2026-03-04"}
				won, held, err := dbs[i%2].ClaimAlert(st, st.SentAt.Add(-time.Hour))
				if err != nil {
					t.Error(err)
					return
				}
				if won {
					wins.Store(i, true)
				} else if held.Kind != detect.KindBrakeEngaged {
					t.Errorf("round %d: a lost claim returned %+v, want the brake's state", round, held)
				}
			})
		}
		close(start)
		wg.Wait()
		n := 0
		wins.Range(func(any, any) bool { n++; return true })
		if n != 1 {
			t.Errorf("round %d: %d claims won, want exactly 1", round, n)
		}
	}
}

// min_interval holds across instances: a claim within the interval of
// another instance's sending, on the same day, loses and sees that
// sending; after the interval, or on the next day, it wins. An early
// warning's claim (once per period) loses in the same period whatever
// the interval, and wins again once its kind is re-armed.
func TestClaimAlertInterval(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	t0 := time.Date(2026, 3, 4, 23, 30, 0, 0, time.UTC)
	alert := func(at time.Time) detect.AlertState {
		return detect.AlertState{Kind: detect.KindUsageCommitFailed, SentAt: at, Summary: "records failing", Period: at.Format("2006-01-02")}
	}
	type claimer interface {
		ClaimAlert(detect.AlertState, time.Time) (bool, detect.AlertState, error)
	}
	steps := []struct {
		name     string
		db       claimer
		at       time.Time
		want     bool
		wantHeld time.Time
	}{
		{"first sending", a, t0, true, time.Time{}},
		{"other instance 10m later", b, t0.Add(10 * time.Minute), false, t0},
		{"same instance 29m later", a, t0.Add(29 * time.Minute), false, t0},
		{"next day, within the interval", b, t0.Add(40 * time.Minute), true, time.Time{}},
		{"10m after that", a, t0.Add(50 * time.Minute), false, t0.Add(40 * time.Minute)},
		{"an interval after", a, t0.Add(100 * time.Minute), true, time.Time{}},
	}
	for _, s := range steps {
		won, held, err := s.db.ClaimAlert(alert(s.at), s.at.Add(-time.Hour))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if won != s.want {
			t.Errorf("%s: claimed = %v, want %v (held by %v)", s.name, won, s.want, held.SentAt)
		}
		if !s.want && !held.SentAt.Equal(s.wantHeld) {
			t.Errorf("%s: held by a sending at %v, want %v", s.name, held.SentAt, s.wantHeld)
		}
	}

	warn := func(at time.Time) detect.AlertState {
		return detect.AlertState{Kind: "budget_warn_daily_usd_80", SentAt: at, Period: at.Format("2006-01")}
	}
	once := []struct {
		name string
		at   time.Time
		want bool
	}{
		{"first of the month", t0, true},
		{"days later, same month", t0.Add(72 * time.Hour), false},
		{"next month", time.Date(2026, 4, 1, 0, 1, 0, 0, time.UTC), true},
	}
	for _, s := range once {
		if won, _, err := b.ClaimAlert(warn(s.at), time.Time{}); err != nil || won != s.want {
			t.Errorf("warning, %s: claimed = %v, %v; want %v", s.name, won, err, s.want)
		}
	}
	// The operator raised the ceiling: the kind is re-armed, and the
	// warning may be sent again in the same month.
	if err := a.SaveAlertState(detect.AlertState{Kind: "budget_warn_daily_usd_80"}); err != nil {
		t.Fatal(err)
	}
	if won, _, err := b.ClaimAlert(warn(time.Date(2026, 4, 2, 0, 0, 0, 0, time.UTC)), time.Time{}); err != nil || !won {
		t.Errorf("warning after a re-arm: claimed = %v, %v; want true", won, err)
	}
}

// quiet is the Alerters' logger: their lines are not the test's output.
var quiet = slog.New(slog.DiscardHandler)

// countingSender counts the mails handed to it.
type countingSender struct {
	mu       sync.Mutex
	subjects []string
}

func (s *countingSender) Send(subject, _ string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subjects = append(s.subjects, subject)
	return true
}

func (s *countingSender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subjects)
}

// Two instances' Alerters on one database raise the brake alert again
// and again, at once: one mail for the service, not one per instance;
// the instance that lost the claim shows the other's sending, and an
// interval later one more mail goes.
func TestAlertersOnOneDatabaseSendOnce(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	var mu sync.Mutex
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	mail := &countingSender{}
	var alerters [2]*detect.Alerter
	for i := range alerters {
		a, err := detect.NewAlerter(open(t, url), detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Mail: mail, Now: clock, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		alerters[i] = a
	}
	raise := func() {
		var wg sync.WaitGroup
		for _, a := range alerters {
			wg.Go(func() {
				for range 20 {
					a.Alert(detect.KindBrakeEngaged, "brake engaged", nil)
				}
			})
		}
		wg.Wait()
	}
	// drain waits for both Alerters' queues by closing them; reopen makes
	// new ones, as a restart would.
	drain := func() {
		for i, a := range alerters {
			if err := a.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			n, err := detect.NewAlerter(open(t, url), detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Mail: mail, Now: clock, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			alerters[i] = n
		}
	}
	raise()
	drain()
	if got := mail.count(); got != 1 {
		t.Fatalf("%d brake mails from two instances, want 1", got)
	}
	for i, a := range alerters {
		if r := a.Recent(); len(r) != 1 || !r[0].SentAt.Equal(now) {
			t.Errorf("instance %d shows %+v, want the one sending at %v", i, r, now)
		}
	}
	mu.Lock()
	now = now.Add(30 * time.Minute)
	mu.Unlock()
	raise()
	drain()
	if got := mail.count(); got != 1 {
		t.Errorf("%d brake mails within the interval, want still 1", got)
	}
	mu.Lock()
	now = now.Add(31 * time.Minute)
	mu.Unlock()
	raise()
	for _, a := range alerters {
		if err := a.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := mail.count(); got != 2 {
		t.Errorf("%d brake mails an interval later, want 2", got)
	}
}

// Early warnings likewise: two instances' Warners see the same share of
// a ceiling crossed (each reads the shared budget's figures) and each
// raises the warning, with the lower share it covers: one mail for the
// service, and the covered share counts as sent on both.
func TestEarlyWarningOnceAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	month := func(t time.Time) string { return t.Format("2006-01") }
	mail := &countingSender{}
	var alerters [2]*detect.Alerter
	for i := range alerters {
		a, err := detect.NewAlerter(open(t, url), detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Mail: mail, Now: clock, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		alerters[i] = a
	}
	var wg sync.WaitGroup
	for _, a := range alerters {
		wg.Go(func() {
			a.AlertOnce("budget_warn_monthly_usd_80", month, "80% of monthly_usd", nil, "budget_warn_monthly_usd_50")
		})
	}
	wg.Wait()
	for _, a := range alerters {
		if err := a.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := mail.count(); got != 1 {
		t.Errorf("%d early warnings from two instances, want 1", got)
	}
	a, err := detect.NewAlerter(open(t, url), detect.AlerterOptions{MinInterval: time.Hour, Location: time.UTC, Now: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	for _, kind := range []string{"budget_warn_monthly_usd_80", "budget_warn_monthly_usd_50"} {
		if !a.SentIn(kind, month, now.Add(24*time.Hour)) {
			t.Errorf("%s not stored as sent this month", kind)
		}
	}
}
