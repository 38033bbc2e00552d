package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// On postgres, thresholds reads the service's events: what every
// instance wrote to the shared database, not one instance's. Two
// instances each wrote part of one user's day; the user's peak is the
// whole day.
func TestThresholdsReadTheServicesEventsOnPostgres(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for instance, n := range []int{10, 20} {
		db, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		events := make([]detect.Event, n)
		for i := range events {
			at := replayDay.Add(time.Duration(instance)*time.Hour + time.Duration(i)*time.Minute)
			events[i] = detect.Event{Time: at, UserID: "alice", Plan: "free", IP: "192.0.2.1", Route: "/v1/ocr", Outcome: "ok", Status: 200}
		}
		err = db.AppendEvents(events)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	config := writeConfig(t, `
[storage]
backend = "postgres"
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 10000
daily_attempts = 1000
[limits.user]
rate = 100
window = "1m"
burst = 0
`)
	env := envFrom(map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": "replay-test-secret-0123456789abcdef"})
	var out bytes.Buffer
	args := []string{"thresholds", "--config", config, "--days", "1", "--to", replayDay.Format("2006-01-02"), "--json"}
	if err := run(context.Background(), args, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Layers []struct {
			Layer     string `json:"layer"`
			Unflagged struct {
				Keys int   `json:"keys"`
				Max  int64 `json:"max"`
			} `json:"unflagged"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json does not parse: %v\n%s", err, out.String())
	}
	found := false
	for _, l := range rep.Layers {
		if l.Layer == "daily" {
			found = true
			if l.Unflagged.Keys != 1 || l.Unflagged.Max != 30 {
				t.Errorf("attempts per day: %+v, want one user at 30 (10 through one instance, 20 through the other)", l.Unflagged)
			}
		}
	}
	if !found {
		t.Fatalf("no daily layer in\n%s", out.String())
	}
}

// On postgres, usage's shadow counts are the service's: a user's
// would-be refusals recorded by two instances are summed.
func TestUsageShadowCountsTheServicesOnPostgres(t *testing.T) {
	url := pgtest.NewDatabase(t)
	config := writeConfig(t, `
[storage]
backend = "postgres"
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 10000
daily_attempts = 1000
`)
	env := envFrom(map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": "usage-test-secret-0123456789abcdef"})
	if err := run(context.Background(), []string{"keys", "create", "--user", "alice", "--plan", "free", "--config", config}, env, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC().Truncate(time.Minute)
	for _, n := range []int64{4, 6} { // each instance's per-minute row
		db, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		err = db.AppendEvents([]detect.Event{{Time: now, UserID: "alice", Plan: "free", Route: "/v1/ocr", Layer: "rate", Outcome: detect.OutcomeShadowRefused, Count: n}})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"usage", "alice", "--json", "--config", config}, env, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var list []struct {
		User        string           `json:"user"`
		ShadowToday map[string]int64 `json:"shadow_today"`
	}
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatalf("--json does not parse: %v\n%s", err, out.String())
	}
	if len(list) != 1 || list[0].ShadowToday["rate"] != 10 {
		t.Errorf("usage alice = %+v, want 10 shadow refusals by rate (4 through one instance, 6 through the other)", list)
	}
}
