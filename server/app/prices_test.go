package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// heldGemini is a fake generateContent that holds every call until
// release is closed, then answers 1,000 prompt and 100 output tokens;
// held counts the calls it holds.
func heldGemini(t *testing.T) (srv *httptest.Server, held *atomic.Int64, release func()) {
	gate := make(chan struct{})
	held = &atomic.Int64{}
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		held.Add(1)
		<-gate
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"serials\":[\"SN-12345\"]}"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":1000,"candidatesTokenCount":100,"thoughtsTokenCount":0,"totalTokenCount":1100}}`)
	}))
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(func() { release(); srv.Close() })
	return srv, held, release
}

// A price change at midnight, with calls in flight on both sides of it,
// on both backends: gemini-3.8-flash is $0.75 / $3.75 per million tokens
// through 2026-12-31 and $1.50 / $7.50 from 2027-01-01, and the config
// leaves [ocr.price] out. Two reads claimed at 23:59:59 and two claimed
// after midnight are all in flight when the clock passes it: each is
// reserved and settled at its own day's price (1,000 in and 100 out:
// 1,125 µ$ on the old day, 2,250 µ$ on the new), and each day's ledger
// holds its own reads at its own price.
func TestPriceChangeAtMidnightWithCallsInFlight(t *testing.T) {
	for _, backend := range []string{"bolt", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			gemini, held, release := heldGemini(t)
			vars := map[string]string{"GEMINI_API_KEY": "test-key",
				"BREAKWATER_SECRET": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}
			section := fmt.Sprintf("[storage]\npath = %q", filepath.Join(t.TempDir(), "bw.db"))
			if backend == "postgres" {
				vars[postgres.EnvURL] = pgtest.NewDatabase(t)
				section = "[storage]\nbackend = \"postgres\""
			}
			cfg, err := Load(writeConfig(t, midnightConfig(section, gemini.URL)), env(vars))
			if err != nil {
				t.Fatal(err)
			}
			clock := newTestClock()
			clock.ns.Store(time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC).UnixNano())
			logs := &lockedWriter{w: &bytes.Buffer{}}
			a, err := Open(context.Background(), cfg, Options{Getenv: env(vars), Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: clock.now})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			key, _, err := a.Keys().Create("ann", "free")
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			statuses := make([]int, 4)
			send := func(i int) {
				wg.Go(func() {
					statuses[i] = postOCR(t, a, key, fmt.Sprintf("midnight-%d", i), grayPNG(t, uint8(10*i))).status
				})
			}
			waitHeld := func(n int64) {
				deadline := time.Now().Add(10 * time.Second)
				for held.Load() < n {
					if time.Now().After(deadline) {
						t.Fatalf("%d calls reached the upstream, want %d in flight", held.Load(), n)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			send(0)
			send(1)
			waitHeld(2) // claimed on 2026-12-31, in flight
			clock.ns.Store(time.Date(2027, 1, 1, 0, 0, 1, 0, time.UTC).UnixNano())
			send(2)
			send(3)
			waitHeld(4) // claimed on 2027-01-01, in flight with the two before
			release()
			wg.Wait()
			for i, s := range statuses {
				if s != http.StatusOK {
					t.Fatalf("read %d: %d, want 200", i, s)
				}
			}
			if n, text := linesWith(logs, `msg="price change: calls are counted at the model's new list price from today"`,
				"model=gemini-3.8-flash day=2027-01-01 input_usd_per_million=1.5 output_usd_per_million=7.5"); n != 1 {
				t.Errorf("the new day's price logged %d times, want once:\n%s", n, text)
			}
			if n, text := linesWith(logs, "price of gemini-3.8-flash on 2026-12-31: $0.75 in / $3.75 out per million tokens; from 2027-01-01 (in 1 days)"); n != 1 {
				t.Errorf("the start logged the price and its change %d times, want once:\n%s", n, text)
			}

			store := a.db.(interface {
				Usage(from, to time.Time) ([]budget.UsageRecord, error)
				BudgetDays(from, to string) ([]budget.LedgerDay, error)
			})
			rows, err := store.Usage(time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 2, 0, 0, 0, 0, time.UTC))
			if err != nil {
				t.Fatal(err)
			}
			costs := map[string][]int64{}
			for _, r := range rows {
				day := r.Time.UTC().Format(time.DateOnly)
				costs[day] = append(costs[day], r.CostMicroUSD)
			}
			if fmt.Sprint(costs) != "map[2026-12-31:[1125 1125] 2027-01-01:[2250 2250]]" {
				t.Errorf("usage rows' costs by day: %v, want 1125 µ$ each on 2026-12-31 and 2250 µ$ each on 2027-01-01", costs)
			}
			// Closed, the brake gives back the rest of its leases: the
			// ledger holds what was spent, read from the stored ledger.
			a.Close()
			days := storedLedger(t, cfg, vars, "2026-12-31", "2027-01-01")
			got := map[string]budget.DayTotals{}
			for _, d := range days {
				got[d.Day] = d.DayTotals
			}
			if got["2026-12-31"] != (budget.DayTotals{Requests: 2, SpendMicroUSD: 2250}) || got["2027-01-01"] != (budget.DayTotals{Requests: 2, SpendMicroUSD: 4500}) {
				t.Errorf("ledger days %+v, want 2 calls and 2250 µ$ on 2026-12-31, 2 calls and 4500 µ$ on 2027-01-01", got)
			}
		})
	}
}

// midnightConfig is the config of the midnight test: gemini-3.8-flash at
// the table's prices, days in UTC, storage as section says.
func midnightConfig(section, baseURL string) string {
	return fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
%s
[ocr]
model = "gemini-3.8-flash"
base_url = %q
dedupe_window = "0s"
[budget]
timezone = "UTC"
[limits.user]
rate = 100000
burst = 1000
[plans.free]
monthly_quota = 1000
`, section, baseURL)
}

// linesWith is how many lines of what l holds (a bytes.Buffer) hold
// every one of parts, and the text, for a failure message.
func linesWith(l *lockedWriter, parts ...string) (int, string) {
	l.mu.Lock()
	text := l.w.(*bytes.Buffer).String()
	l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(text, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n, text
}

// storedLedger reads the ledger's days from..to of a closed App's
// database, bolt or PostgreSQL as cfg says.
func storedLedger(t *testing.T, cfg Config, vars map[string]string, from, to string) []budget.LedgerDay {
	t.Helper()
	var store interface {
		BudgetDays(from, to string) ([]budget.LedgerDay, error)
		Close() error
	}
	var err error
	if cfg.Storage.Backend == storage.BackendPostgres {
		store, err = postgres.Open(context.Background(), vars[postgres.EnvURL], postgres.Options{Logger: slog.New(slog.DiscardHandler)})
	} else {
		store, err = storage.Open(cfg.Storage.Path, storage.Options{ReadOnly: true, Logger: slog.New(slog.DiscardHandler)})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	days, err := store.BudgetDays(from, to)
	if err != nil {
		t.Fatal(err)
	}
	return days
}

// The docs' override with prices in time loads as written, and its model
// is charged each period's price from its first day.
func TestPricesInTimeSnippetLoads(t *testing.T) {
	doc, err := os.ReadFile("../../docs/CONFIGURATION.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n### Prices in time\n.*?```toml\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/CONFIGURATION.md has no toml block under ### Prices in time")
	}
	cfg, err := Load(writeConfig(t, "[ocr]\nmodel = \"my-model\"\n"+string(m[1])+"[plans.free]\nmonthly_quota = 10\n"), env(map[string]string{"GEMINI_API_KEY": "k"}))
	if err != nil {
		t.Fatalf("the docs' snippet: %v", err)
	}
	p, ok := cfg.OCR.PriceOf("my-model")
	if !ok {
		t.Fatal("my-model unknown")
	}
	for day, want := range map[string][2]float64{"2025-01-01": {1, 4}, "2026-12-31": {1, 4}, "2027-01-01": {2, 8}} {
		if got := p.On(day); got.InputUSDPerMillion != want[0] || got.OutputUSDPerMillion != want[1] {
			t.Errorf("on %s: $%g / $%g, want $%g / $%g", day, got.InputUSDPerMillion, got.OutputUSDPerMillion, want[0], want[1])
		}
	}
	// Unquoted, TOML reads a date, not the day the key wants: refused with
	// what to write.
	_, err = Load(writeConfig(t, "[ocr]\nmodel = \"my-model\"\n[[ocr.model_overrides]]\nname = \"my-model\"\nimage_tokens = \"tiles\"\n"+
		"prices = [ { from = 2026-01-01, input_usd_per_million = 1.0, output_usd_per_million = 4.0 } ]\n[plans.free]\nmonthly_quota = 10\n"),
		env(map[string]string{"GEMINI_API_KEY": "k"}))
	if err == nil || !strings.Contains(err.Error(), "from") {
		t.Errorf("an unquoted day: %v, want an error naming from", err)
	}
}
