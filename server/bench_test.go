package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/ocr"
	"breakwater/storage"
)

// benchClients is how many requests are in flight at once in the load
// benchmarks: enough for group commit to share fsyncs, as real traffic does.
const benchClients = 64

// BenchmarkAcceptedVsBareEcho measures accepted OCR requests per second,
// with the simulated upstream at zero latency and durable accounting (a
// real BoltDB file with fsync), beside a bare Echo handler that reads the
// same body and answers a small JSON, in the same run over real loopback
// HTTP. It prints both rates and their ratio (target: at least 0.25).
//
//	go test -run '^$' -bench AcceptedVsBareEcho -benchtime 20000x ./server/
func BenchmarkAcceptedVsBareEcho(b *testing.B) {
	img := pngBytes(b, 64, 64)

	bare := echo.New()
	bare.POST("/v1/ocr", func(c echo.Context) error {
		if _, err := io.Copy(io.Discard, c.Request().Body); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]any{"serials": []string{"SIM-00000000"}})
	})
	bareSrv := httptest.NewServer(bare)
	defer bareSrv.Close()

	ours, keys := newBenchService(b)
	oursSrv := httptest.NewServer(ours.Handler())
	defer oursSrv.Close()

	b.ResetTimer()
	bareRate := load(b, bareSrv.URL, nil, img, b.N)
	oursRate := load(b, oursSrv.URL, keys, img, b.N)
	b.StopTimer()

	b.ReportMetric(bareRate, "bare-req/s")
	b.ReportMetric(oursRate, "accepted-req/s")
	b.ReportMetric(oursRate/bareRate, "ratio")
	fmt.Printf("bare echo %.0f req/s, breakwater accepted %.0f req/s, ratio %.2f (n=%d, %d clients)\n",
		bareRate, oursRate, oursRate/bareRate, b.N, benchClients)
}

// newBenchService is the whole request path on a real database: keyring,
// quotas, simulated reader, group-committed usage records, statistics.
func newBenchService(b *testing.B) (*Server, []string) {
	b.Helper()
	log := slog.New(slog.DiscardHandler)
	db, err := storage.Open(filepath.Join(b.TempDir(), "bench.db"), storage.Options{Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	plans := map[string]budget.Plan{"free": {MonthlyQuota: 1 << 40}}
	kr, err := NewKeyring(db, func(p string) bool { return p == "free" })
	if err != nil {
		b.Fatal(err)
	}
	var keys []string
	for i := range 100 {
		secret, _, err := kr.Create(fmt.Sprintf("user-%03d", i), "")
		if err != nil {
			b.Fatal(err)
		}
		keys = append(keys, secret)
	}
	reader, err := ocr.NewSimulated(ocr.Config{Provider: "simulated"}.WithDefaults())
	if err != nil {
		b.Fatal(err)
	}
	events := detect.NewRecorder(db, detect.RecorderOptions{Logger: log})
	b.Cleanup(func() { events.Close(context.Background()) })
	windows, err := limiter.New(limiter.Config{Rate: limiter.MaxRate, Window: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	brake, err := budget.NewGlobal(budget.Config{DailyRequests: 1 << 40, DailyUSD: 1e9, MonthlyUSD: 1e9}, time.UTC, db,
		budget.GlobalState{Day: budget.DayKey(now, time.UTC), Month: budget.MonthKey(now, time.UTC)})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{}, Deps{
		Keys: kr, Limiter: windows, Attempts: budget.NewAttempts(time.UTC, budget.DayKey(now, time.UTC), nil),
		Quotas: budget.NewQuotas(time.UTC, budget.MonthKey(now, time.UTC), nil), Brake: brake, Plans: plans,
		Reader: reader, Usage: db, Events: events, Logger: log,
	})
	if err != nil {
		b.Fatal(err)
	}
	return srv, keys
}

// load sends n requests from benchClients goroutines with keep-alive and
// returns the rate of 200 answers per second. Any other answer fails b.
func load(b *testing.B, base string, keys []string, img []byte, n int) float64 {
	b.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: benchClients, MaxConnsPerHost: benchClients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/ocr", bytes.NewReader(img))
				req.Header.Set("Content-Type", "image/png")
				if keys != nil {
					req.Header.Set("Authorization", "Bearer "+keys[int(i)%len(keys)])
				}
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d requests to %s failed", f, n, base)
	}
	return float64(n) / elapsed.Seconds()
}
