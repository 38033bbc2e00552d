package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage"
	"breakwater/test/harness"
)

// TestCrashLoopShort is the crash loop's short form, run by go test ./...:
// five rounds (a kill at each failpoint, one at a random moment, two at
// the budget ceiling) with zero violations.
func TestCrashLoopShort(t *testing.T) {
	runShortLoop(t, 90*time.Second, Options{})
}

// runShortLoop runs the crash loop's short form (five rounds) with o and
// checks what every backend promises: zero violations, a kill of each
// kind, the ceiling reached and the load run, each 200 with its usage row.
func runShortLoop(t *testing.T, timeout time.Duration, o Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	o.Rounds, o.Dir, o.Log = 5, t.TempDir(), t.Logf
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Summary())
	if len(rep.Violations) > 0 {
		t.Fatalf("%d violations", len(rep.Violations))
	}
	for _, k := range []string{killReserved, killRecorded, killRandom, killCeiling} {
		if rep.Kills[k] == 0 {
			t.Errorf("no kill of kind %s: %v", k, rep.Kills)
		}
	}
	if !rep.CeilingReached {
		// The last round's server log says what the brake saw: its
		// warnings and brake_engaged count the calls in flight with the
		// ledger's.
		t.Errorf("the loop did not reach daily_requests %d (ledger %d); the last round's server log ends:\n%s",
			rep.DailyRequests, rep.Ledger, harness.Tail(filepath.Join(o.Dir, fmt.Sprintf("round-%02d.log", rep.Rounds))))
	}
	if rep.OK == 0 || rep.Calls == 0 || rep.UsageRows == 0 {
		t.Errorf("%d 200s, %d upstream calls, %d usage rows: the load did not run", rep.OK, rep.Calls, rep.UsageRows)
	}
}

// TestCheckFindsViolations feeds the checker states that break each
// promise, so that a loop reporting zero violations means something.
func TestCheckFindsViolations(t *testing.T) {
	root, err := harness.ModuleRoot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, l *loop, db *storage.DB)
		want  string
	}{
		{"200 without a usage row", func(t *testing.T, l *loop, db *storage.DB) {
			l.ok["req-answered"] = "u1"
			l.okByUser["u1"]++
		}, "a 200 without a usage row: request req-answered"},
		{"row under another user", func(t *testing.T, l *loop, db *storage.DB) {
			record(t, db, "u2", "req-1")
			l.ok["req-1"] = "u1"
		}, "usage row of u2, answered to u1"},
		{"fewer quota than 200s", func(t *testing.T, l *loop, db *storage.DB) {
			record(t, db, "u1", "req-1")
			l.okByUser["u1"] = 2
		}, "below the 2 200s received"},
		{"committed row lost", func(t *testing.T, l *loop, db *storage.DB) {
			l.rowsSeen["req-gone"] = true
		}, "usage row of request req-gone, seen after an earlier round, is gone"},
		{"call without a reservation", func(t *testing.T, l *loop, db *storage.DB) {
			call(t, l.gemini)
		}, "a reservation was lost"},
		{"calls over the ceiling", func(t *testing.T, l *loop, db *storage.DB) {
			for range 3 {
				reserve(t, db)
				call(t, l.gemini)
			}
		}, "the upstream received 3 calls, over daily_requests 2"},
		{"ledger far over the calls", func(t *testing.T, l *loop, db *storage.DB) {
			if err := db.Lease(t.Context(), time.Now().UTC().Format("2006-01-02"), 2, 20); err != nil {
				t.Fatal(err)
			}
		}, "the ledger's excess over the calls made grew by 2 in one round, over the bound of 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := harness.NewGemini(root, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			l := &loop{
				o:      Options{DailyRequests: 2},
				dbPath: filepath.Join(t.TempDir(), "bw.db"),
				gemini: g,
				rep:    &Report{Kills: map[string]int{}, Answers: map[string]int64{}},
				ok:     map[string]string{}, okByUser: map[string]int64{}, rowsSeen: map[string]bool{}, reported: map[string]bool{},
			}
			db, err := storage.Open(l.dbPath, storage.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			tt.setup(t, l, db)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if err := l.check(1); err != nil {
				t.Fatal(err)
			}
			got := strings.Join(l.rep.Violations, "\n")
			if !strings.Contains(got, tt.want) {
				t.Errorf("violations:\n%s\nwant one with %q", got, tt.want)
			}
		})
	}
}

// record commits one read as the server does: a lease of its call, then
// its usage row with the settlement.
func record(t *testing.T, db *storage.DB, user, requestID string) {
	t.Helper()
	now := time.Now().UTC()
	day := reserve(t, db)
	rec := budget.UsageRecord{Time: now, UserID: user, KeyID: "k", RequestID: requestID, Outcome: "ok"}
	err := db.RecordUsage(context.Background(), now.Format("2006-01"), rec, budget.Settlement{Day: day, ActualMicroUSD: 1, Leased: true, LeasedMicroUSD: 10})
	if err != nil {
		t.Fatal(err)
	}
}

// reserve leases one call at 10 µ$ today, and returns today.
func reserve(t *testing.T, db *storage.DB) string {
	t.Helper()
	day := time.Now().UTC().Format("2006-01-02")
	if err := db.Lease(context.Background(), day, 1, 10); err != nil {
		t.Fatal(err)
	}
	return day
}

// call sends the fake Gemini one call, as the server would.
func call(t *testing.T, g *harness.Gemini) {
	t.Helper()
	body := `{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"iVBORw0K"}}]}]}`
	req, err := http.NewRequest(http.MethodPost, g.URL+"/v1beta/models/"+harness.Model+":generateContent", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-goog-api-key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("fake Gemini: %s", resp.Status)
	}
}

// buildWithGemini builds the binary into a folder of t's and starts a fake
// Gemini that counts calls; t's end closes it.
func buildWithGemini(ctx context.Context, t *testing.T) (dir, bin string, g *harness.Gemini) {
	t.Helper()
	root, err := harness.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if bin, err = harness.Build(ctx, root, dir); err != nil {
		t.Fatal(err)
	}
	if g, err = harness.NewGemini(root, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return dir, bin, g
}

// TestKillWithALeaseOpen kills the real server (SIGKILL) while its budget
// lease has headroom no call used: after the kill the ledger covers every
// call made, and counts at most one lease more. After a restart and a
// clean stop (SIGTERM), the lease of the second run is given back: the
// ledger is then the calls made plus only what the kill left.
func TestKillWithALeaseOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir, bin, g := buildWithGemini(ctx, t)
	const dailyRequests = budget.LeaseCalls * budget.LeaseShare // a lease of budget.LeaseCalls
	lease := budget.MaxLease(budget.Config{DailyRequests: dailyRequests})
	if lease != budget.LeaseCalls {
		t.Fatalf("MaxLease %d, want %d", lease, budget.LeaseCalls)
	}
	dbPath := filepath.Join(dir, "bw.db")
	config := filepath.Join(dir, "config.toml")
	if err := harness.WriteConfig(config, harness.Config{DBPath: dbPath, GeminiURL: g.URL, DailyRequests: dailyRequests, Plan: "crash"}); err != nil {
		t.Fatal(err)
	}
	key, err := harness.CreateKey(ctx, bin, config, "lease-user", "crash")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 15 * time.Second}
	img := harness.PNG()
	serve := func(run string, reads int) *harness.Process {
		t.Helper()
		proc, err := harness.Start(bin, config, filepath.Join(dir, run+".log"), "GEMINI_API_KEY=k")
		if err != nil {
			t.Fatal(err)
		}
		for range reads {
			if a := harness.Post(ctx, client, proc.Addr, key, img); a.Status != http.StatusOK {
				proc.Kill()
				t.Fatalf("%s: %d %s %v", run, a.Status, a.Code, a.Err)
			}
		}
		return proc
	}
	ledger := func() int64 {
		t.Helper()
		db, err := storage.Open(dbPath, storage.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		day, err := db.Budget(time.Now().UTC().Format("2006-01-02"))
		if err != nil {
			t.Fatal(err)
		}
		return day.Requests
	}

	serve("killed", 5).Kill()
	_, calls := g.Calls()
	killed := ledger()
	if killed < calls || killed-calls > lease {
		t.Fatalf("after the kill the ledger holds %d calls for %d made; want at least the calls and at most %d more", killed, calls, lease)
	}
	if killed == calls {
		t.Errorf("the ledger holds exactly the %d calls: no lease was open at the kill", calls)
	}
	left := killed - calls

	serve("stopped", 3).Stop(20 * time.Second)
	_, calls = g.Calls()
	if got, want := ledger(), calls+left; got != want {
		t.Errorf("after a clean stop the ledger holds %d calls; want the %d made plus the %d the kill left", got, calls, left)
	}
}
