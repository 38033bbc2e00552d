package app

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"breakwater/storage"
)

// soakDays, when set, runs each soak case for that many simulated days
// instead of its CI form: go test ./server/app -run Soak -soak.days 400.
var soakDays = flag.Int("soak.days", 0, "simulated days of each soak case (0: the short CI form)")

// memListener is a listener that never accepts: in a synctest bubble a
// real socket's Accept would keep the fake clock from moving.
type memListener struct {
	once   sync.Once
	closed chan struct{}
}

func (l *memListener) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *memListener) Close() error              { l.once.Do(func() { close(l.closed) }); return nil }
func (l *memListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// soakLog keeps what the soak checks from the service's log: the daily
// detection runs (by day) and the alerts (by kind and local day), each
// stamped with the service's clock.
type soakLog struct {
	mu     sync.Mutex
	now    func() time.Time
	loc    *time.Location
	runs   map[string][]time.Time // day run -> when
	alerts map[string]int         // "kind day" -> count
	errors []string
}

func (l *soakLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *soakLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *soakLog) WithGroup(string) slog.Handler            { return l }
func (l *soakLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	switch {
	case r.Message == "daily detection done":
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "day" {
				l.runs[a.Value.String()] = append(l.runs[a.Value.String()], now)
			}
			return true
		})
	case strings.HasPrefix(r.Message, "ALERT "):
		l.alerts[strings.TrimPrefix(r.Message, "ALERT ")+" "+now.In(l.loc).Format(time.DateOnly)]++
	case r.Level >= slog.LevelError:
		l.errors = append(l.errors, r.Message)
	}
	return nil
}

// The soak: days of simulated traffic through the real service (app.Open,
// its handler driven in-process) in a synctest bubble, whose clock the
// App takes through Options.Now, across a month end and a DST change in
// the budget's time zone. Every simulated day:
//
//   - 00:05 a user on a 2-read monthly quota reads: refused, except on
//     the 1st in budget.timezone (the quota month has reset), and on the
//     first day, when it uses its two reads;
//   - 00:20 the daily detection of yesterday has run, once, at run_at;
//   - 00:30 a user with a daily line of 5 sends 7: exactly 5 pass, so
//     yesterday's attempts did not carry over;
//   - 12:00 a user with no line reads until the brake stops it: the day's
//     calls are daily_requests exactly, so yesterday's did not carry over;
//     it tries again every 10 minutes until 12:50: the brake alert is sent
//     once that day;
//   - 23:58 the quota user is refused again (in New York the 1st has
//     begun in UTC by then; the quota must not reset by UTC).
//
// At the end, with the service closed, the ledger's days hold exactly the
// calls the test saw each day and the settled cost of that day's usage
// rows (no spend overwritten or moved), with no reservation open.
func TestSoakAcrossMidnightMonthEndAndDST(t *testing.T) {
	for _, tc := range []struct {
		name, tz, from string
		days           int
	}{
		// Oct 31 -> Nov 1 is a month end, and Nov 1 2026 the fall-back
		// day (25 hours) in New York.
		{"New York, month end and fall back", "America/New_York", "2026-10-30", 4},
		// Mar 29 2026 is the spring-forward day (23 hours) in Berlin,
		// Mar 31 -> Apr 1 a month end.
		{"Berlin, spring forward and month end", "Europe/Berlin", "2026-03-28", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			days := tc.days
			if *soakDays > 0 {
				days = *soakDays
			}
			dir := t.TempDir()
			synctest.Test(t, func(t *testing.T) { soak(t, dir, tc.tz, tc.from, days) })
		})
	}
}

// soakAlerts are the alerts of a soak day, each once: the early warnings
// of the default shares (warn_at left out), then the brake's.
var soakAlerts = []string{"budget_warn_daily_requests_50", "budget_warn_daily_requests_80", "budget_warn_daily_requests_95", "brake_engaged"}

const (
	soakDailyRequests = 20
	soakLine          = 5
	soakQuota         = 2
)

// soakRun is one soak case: the service, its clock and its log, the keys
// of the three users, and what the test saw.
type soakRun struct {
	t        *testing.T
	tz       string
	loc      *time.Location
	first    time.Time // the first day's start, in loc
	now      func() time.Time
	log      *soakLog
	dbPath   string
	a        *App
	closed   bool
	h        http.Handler
	key      map[string]string // plan -> API key
	calls    map[string]int64  // local day -> 200s
	refusals int
}

func soak(t *testing.T, dir, tz, from string, days int) {
	r := openSoak(t, dir, tz, from)
	defer func() {
		if !r.closed {
			r.a.Close()
		}
	}()
	for i := range days {
		r.day(i)
	}
	last := time.Date(r.first.Year(), r.first.Month(), r.first.Day()+days-1, 0, 0, 0, 0, r.loc)
	r.until(last, 23, 59)
	r.a.Close()
	r.closed = true

	detections := r.checkLog(days)
	total := r.checkLedger(last, days)
	t.Logf("%s: %d simulated days from %s, %d reads, %d detection runs, %d refusals checked", tz, days, r.first.Format(time.DateOnly), total, detections, r.refusals)
}

// soakConfig is the service's config.toml for a soak in time zone tz
// with its database at dbPath: three plans (a monthly quota, a daily
// line, neither) under a daily_requests ceiling.
func soakConfig(dbPath, tz string) string {
	return fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[storage]
path = %q
[ocr]
provider = "simulated"
dedupe_window = "0s"
[budget]
timezone = %q
daily_requests = %d
daily_usd = 1000.0
monthly_usd = 100000.0
[limits.user]
rate = 0
burst = 0
[plans.free]
monthly_quota = 10
[plans.month]
monthly_quota = %d
daily_attempts = 0
[plans.line]
monthly_quota = 1000000
daily_attempts = %d
[plans.bulk]
monthly_quota = 1000000
daily_attempts = 0
`, dbPath, tz, soakDailyRequests, soakQuota, soakLine)
}

// openSoak opens the service in dir with its clock at the start of the
// day from in tz, and makes a key on each of the plans month, line and
// bulk.
func openSoak(t *testing.T, dir, tz, from string) *soakRun {
	loc, err := time.LoadLocation(tz)
	if err != nil {
		t.Fatal(err)
	}
	first, err := time.ParseInLocation(time.DateOnly, from, loc)
	if err != nil {
		t.Fatal(err)
	}
	// The service's clock: the bubble's, moved to the first day's start.
	offset := first.Sub(time.Now())
	now := func() time.Time { return time.Now().Add(offset) }
	r := &soakRun{t: t, tz: tz, loc: loc, first: first, now: now, dbPath: filepath.Join(dir, "bw.db"),
		log: &soakLog{now: now, loc: loc, runs: map[string][]time.Time{}, alerts: map[string]int{}},
		key: map[string]string{}, calls: map[string]int64{}}

	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(soakConfig(r.dbPath, tz)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(cfgPath, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.a, err = Open(context.Background(), cfg, Options{
		Getenv: env(map[string]string{"BREAKWATER_SECRET": "a secret for the soak test"}),
		Logger: slog.New(r.log), Now: now,
		Listen: func(string, string) (net.Listener, error) { return &memListener{closed: make(chan struct{})}, nil },
		// A copy a second was 80% of the soak's time: 777,600 of them.
		WriteBehindEvery: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, plan := range []string{"month", "line", "bulk"} {
		if r.key[plan], _, err = r.a.Keys().Create("soak-"+plan, plan); err != nil {
			r.a.Close()
			t.Fatal(err)
		}
	}
	r.h = r.a.Handler()
	return r
}

// read sends one read as the user on plan and returns the status and,
// for a refusal, the problem's code.
func (r *soakRun) read(plan string) (int, string) {
	req := httptest.NewRequest(http.MethodPost, "/v1/ocr", strings.NewReader(string(soakImage())))
	req.Header.Set("Authorization", "Bearer "+r.key[plan])
	req.Header.Set("Content-Type", "image/png")
	rec := httptest.NewRecorder()
	r.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		r.refusals++
	}
	if rec.Code == http.StatusOK {
		r.calls[r.now().In(r.loc).Format(time.DateOnly)]++
		return rec.Code, ""
	}
	var code string
	if _, after, ok := strings.Cut(rec.Body.String(), `"code":"`); ok {
		code, _, _ = strings.Cut(after, `"`)
	}
	return rec.Code, code
}

// until moves the clock to hour:minute of day and waits for the
// service's background work of the moment.
func (r *soakRun) until(day time.Time, hour, minute int) {
	target := time.Date(day.Year(), day.Month(), day.Day(), hour, minute, 0, 0, r.loc)
	if d := target.Sub(r.now()); d > 0 {
		time.Sleep(d)
	}
	synctest.Wait() // the service's background work of the moment is done
}

// day runs and checks the i-th simulated day, as the comment on
// TestSoakAcrossMidnightMonthEndAndDST lists.
func (r *soakRun) day(i int) {
	day := time.Date(r.first.Year(), r.first.Month(), r.first.Day()+i, 0, 0, 0, 0, r.loc)
	name := day.Format(time.DateOnly)
	r.until(day, 0, 5)
	r.checkMonthlyQuota(i, day, name)
	r.until(day, 0, 20)
	r.checkDetectionRan(i, day, name)
	r.until(day, 0, 30)
	r.checkDailyLine(name)
	r.until(day, 12, 0)
	r.checkBrake(day, name)

	r.until(day, 23, 58)
	if status, code := r.read("month"); code != "quota_exceeded" {
		r.t.Errorf("%s 23:58: the quota reset before midnight in %s: %d %s", name, r.tz, status, code)
	}
	r.log.mu.Lock()
	for _, kind := range soakAlerts {
		if got := r.log.alerts[kind+" "+name]; got != 1 {
			r.t.Errorf("%s: %d alerts %s, want 1 (each share crossed once, the brake engaged once, at 12:00)", name, got, kind)
		}
	}
	r.log.mu.Unlock()
}

// checkMonthlyQuota, at 00:05: the quota user is refused, except on the
// first day and on the 1st, when it has its two reads and no third.
func (r *soakRun) checkMonthlyQuota(i int, day time.Time, name string) {
	t := r.t
	status, code := r.read("month")
	switch {
	case i == 0 || day.Day() == 1:
		if status != http.StatusOK {
			t.Errorf("%s 00:05: a new quota month's first read got %d %s", name, status, code)
		}
		if status, _ = r.read("month"); status != http.StatusOK {
			t.Errorf("%s 00:05: the second read of the month got %d", name, status)
		}
		if status, code = r.read("month"); code != "quota_exceeded" {
			t.Errorf("%s 00:05: a read past the quota got %d %s", name, status, code)
		}
	case code != "quota_exceeded":
		t.Errorf("%s 00:05: the quota used up this month: %d %s, want 429 quota_exceeded", name, status, code)
	}
}

// checkDetectionRan, at 00:20: yesterday was detected once, at 00:15.
func (r *soakRun) checkDetectionRan(i int, day time.Time, name string) {
	yesterday := day.AddDate(0, 0, -1).Format(time.DateOnly)
	r.log.mu.Lock()
	runs := r.log.runs[yesterday]
	r.log.mu.Unlock()
	runAt := time.Date(day.Year(), day.Month(), day.Day(), 0, 15, 0, 0, r.loc)
	if len(runs) != 1 {
		r.t.Errorf("%s 00:20: the detection of %s ran %d times, want once", name, yesterday, len(runs))
	} else if i > 0 && (runs[0].Before(runAt) || runs[0].After(runAt.Add(time.Minute))) {
		r.t.Errorf("%s: the detection of %s ran at %s, want at 00:15", name, yesterday, runs[0].In(r.loc).Format(time.TimeOnly))
	}
}

// checkDailyLine, at 00:30: of 7 reads on a daily line of 5, exactly 5
// pass.
func (r *soakRun) checkDailyLine(name string) {
	passed := 0
	for range soakLine + 2 {
		if status, code := r.read("line"); status == http.StatusOK {
			passed++
		} else if code != "daily_limit" {
			r.t.Errorf("%s 00:30: %d %s, want 200 or 429 daily_limit", name, status, code)
		}
	}
	if passed != soakLine {
		r.t.Errorf("%s 00:30: %d of %d passed a daily line of %d: yesterday's attempts carried over, or the line did not hold", name, passed, soakLine+2, soakLine)
	}
}

// checkBrake, from 12:00: the day's calls stop at daily_requests exactly,
// and the brake holds every 10 minutes until 12:50.
func (r *soakRun) checkBrake(day time.Time, name string) {
	var status int
	var code string
	for range soakDailyRequests + 1 {
		if status, code = r.read("bulk"); status != http.StatusOK {
			break
		}
	}
	if code != "budget_paused" || r.calls[name] != soakDailyRequests {
		r.t.Errorf("%s 12:00: %d calls, then %d %s; want %d calls, then 503 budget_paused", name, r.calls[name], status, code, soakDailyRequests)
	}
	for m := 10; m <= 50; m += 10 {
		r.until(day, 12, m)
		if status, code := r.read("bulk"); code != "budget_paused" {
			r.t.Errorf("%s 12:%02d: the brake let a call through: %d %s", name, m, status, code)
		}
	}
}

// checkLog: every alert was a brake alert or an early warning of the
// day's calls, each once a day (each share's warning raised by the claim
// that crosses it, though the calls reach the ceiling within seconds);
// every day
// before the last was detected once; no error was logged. It returns the number
// of days detected.
func (r *soakRun) checkLog(days int) int {
	t, log := r.t, r.log
	log.mu.Lock()
	defer log.mu.Unlock()
	for k, n := range log.alerts {
		kind, _, _ := strings.Cut(k, " ")
		if !slices.Contains(soakAlerts, kind) || n != 1 {
			t.Errorf("unexpected alert %s (%d)", k, n)
		}
	}
	for d, runs := range log.runs {
		if len(runs) != 1 {
			t.Errorf("day %s detected %d times", d, len(runs))
		}
	}
	if got, want := len(log.runs), days+1; got != want { // the catch-up of the day before the first, then one a day
		t.Errorf("%d days detected, want %d", got, want)
	}
	if len(log.errors) > 0 {
		t.Errorf("errors logged: %q", log.errors)
	}
	return len(log.runs)
}

// checkLedger, with the service closed: the ledger's days hold exactly
// the calls the test saw each day and the settled cost of that day's
// usage rows, with no reservation open. It returns the number of usage
// rows.
func (r *soakRun) checkLedger(last time.Time, days int) int64 {
	t := r.t
	db, err := storage.Open(r.dbPath, storage.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lastName := last.Format(time.DateOnly)
	ledger, err := db.BudgetDays(r.first.Format(time.DateOnly), lastName)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Usage(r.first.Add(-time.Hour), last.AddDate(0, 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	cost := map[string]int64{}
	var total int64
	for _, row := range rows {
		cost[row.Time.In(r.loc).Format(time.DateOnly)] += row.CostMicroUSD
		total++
	}
	if len(ledger) != days {
		t.Errorf("the ledger has %d days, want %d: %+v", len(ledger), days, ledger)
	}
	var ledgerCalls int64
	for _, d := range ledger {
		ledgerCalls += d.Requests
		if d.Requests != r.calls[d.Day] || d.Requests != soakDailyRequests {
			t.Errorf("ledger %s: %d requests, the test saw %d calls; want %d", d.Day, d.Requests, r.calls[d.Day], soakDailyRequests)
		}
		if d.SpendMicroUSD != cost[d.Day] || d.SpendMicroUSD == 0 {
			t.Errorf("ledger %s: spend %d µ$, the day's usage rows cost %d µ$", d.Day, d.SpendMicroUSD, cost[d.Day])
		}
	}
	if ledgerCalls != total {
		t.Errorf("the ledger's days add up to %d calls, the usage rows are %d", ledgerCalls, total)
	}
	if n, err := db.OpenReservations(); err != nil || n != 0 {
		t.Errorf("open reservations after the soak: %d %v", n, err)
	}
	return total
}

// soakImage is a small PNG; ocr.dedupe_window is off, so every read of
// it is a call.
func soakImage() []byte {
	img := image.NewGray(image.Rect(0, 0, 32, 8))
	var buf bytes.Buffer
	_ = png.Encode(&buf, img)
	return buf.Bytes()
}
