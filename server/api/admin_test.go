package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/server/edgetest"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/storage"
)

func TestAdminClientManagesKeys(t *testing.T) {
	e := newEnv(t, envOptions{plans: map[string]int64{"pro": 1000}})
	ctx := context.Background()
	ac := operator.NewAdminClient(strings.TrimPrefix(e.admin.URL, "http://"), testAdminToken)

	secret, info, err := ac.CreateKey(ctx, "carol", "pro")
	if err != nil {
		t.Fatal(err)
	}
	if info.UserID != "carol" || info.Plan != "pro" || !strings.HasPrefix(secret, "bw_") || len(secret) < 35 {
		t.Errorf("created %+v with %q", info, secret)
	}
	resp, data := e.post(secret, "image/png", pngBytes(t, 8, 8))
	if got := decodeOK(t, resp, data).Quota.Limit; got != 1000 {
		t.Errorf("pro quota limit %d, want 1000", got)
	}

	list, err := ac.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("%d keys, want 2", len(list))
	}
	if _, body := do(t, mustRequest(t, http.MethodGet, e.admin.URL+"/api/keys", testAdminToken)); strings.Contains(string(body), secret) || strings.Contains(string(body), e.key) {
		t.Error("keys list shows a secret")
	}

	if _, err := ac.RevokeKey(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(secret, "image/png", pngBytes(t, 8, 8))
	edgetest.DecodeProblem(t, resp, data, http.StatusUnauthorized, "unauthorized")

	if _, err := ac.RevokeKey(ctx, "key_nope"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("revoke unknown: %v, want keys.ErrNotFound", err)
	}
	if _, _, err := ac.CreateKey(ctx, "dave", "platinum"); err == nil || !strings.Contains(err.Error(), "unknown plan") {
		t.Errorf("unknown plan: %v", err)
	}
	if _, _, err := ac.CreateKey(ctx, "bad\x00id", ""); err == nil {
		t.Error("control character in user id accepted")
	}
}

func adminClient(e *env) *operator.AdminClient {
	return operator.NewAdminClient(strings.TrimPrefix(e.admin.URL, "http://"), testAdminToken)
}

func TestBanTakesEffectOnNextRequest(t *testing.T) {
	e := newEnv(t, envOptions{plans: map[string]int64{"pro": 1000}})
	ac := adminClient(e)
	ctx := context.Background()
	img := pngBytes(t, 8, 8)
	resp, data := e.post(e.key, "image/png", img)
	decodeOK(t, resp, data)

	if _, err := ac.SetBanned(ctx, "alice", true, false); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(e.key, "image/png", img)
	edgetest.DecodeProblem(t, resp, data, http.StatusForbidden, "banned")
	if got := e.gemini.calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
	if _, err := ac.SetBanned(ctx, "alice", false, false); err != nil {
		t.Fatal(err)
	}
	if info, err := ac.SetPlan(ctx, "alice", "pro"); err != nil || info.Plan != "pro" {
		t.Fatalf("set-plan: %+v %v", info, err)
	}
	resp, data = e.post(e.key, "image/png", img)
	if got := decodeOK(t, resp, data).Quota.Limit; got != 1000 {
		t.Errorf("quota limit %d after set-plan, want 1000", got)
	}
	if _, err := ac.SetPlan(ctx, "nobody", "pro"); !errors.Is(err, keys.ErrNotFound) {
		t.Errorf("set-plan of an unknown user: %v", err)
	}
	if _, err := ac.SetPlan(ctx, "alice", "gold"); err == nil {
		t.Error("set-plan to an unknown plan accepted")
	}
	usage, err := ac.Usage(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(usage) != 1 || usage[0].ReadsMonth != 2 || usage[0].ReadsToday != 2 || usage[0].AttemptsToday != 2 || usage[0].Plan != "pro" ||
		usage[0].CostMonthUSD <= 0 || usage[0].CostTodayUSD != usage[0].CostMonthUSD {
		t.Errorf("usage %+v", usage)
	}
	// The ban is stored: a fresh keyring over the same database sees it.
	if _, err := ac.SetBanned(ctx, "alice", true, false); err != nil {
		t.Fatal(err)
	}
	kr, err := keys.NewKeyring(e.db, e.plans.Has, keys.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !kr.Banned("alice") {
		t.Error("the ban did not reach the database")
	}
}

func TestManualBrake(t *testing.T) {
	rec := &recordingAlerter{}
	e := newEnv(t, envOptions{alerts: rec})
	ac := adminClient(e)
	ctx := context.Background()
	b, err := ac.SetBrake(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Manual || !b.Engaged || b.EngagedBy != "manual" {
		t.Errorf("budget after brake on: %+v", b)
	}
	// The answer says what is true: the operator paused the service (not
	// a spending limit), and to look again in five minutes.
	resp, data := e.post(e.key, "image/png", pngBytes(t, 8, 8))
	edgetest.DecodeProblem(t, resp, data, http.StatusServiceUnavailable, "paused_by_operator")
	if got := resp.Header.Get("Retry-After"); got != "300" {
		t.Errorf("Retry-After %q, want 300", got)
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("%d upstream calls with the brake on", got)
	}
	// The alert confirms that calls are really refused, as the README
	// says of brake_engaged.
	if got := rec.got(); len(got) != 1 || got[0] != "brake_engaged" {
		t.Errorf("the operator's switch raised alerts %v, want brake_engaged", got)
	}
	// The switch survives a restart.
	if on, err := e.db.Flag("brake"); err != nil || !on {
		t.Errorf("stored brake %v %v", on, err)
	}
	if _, err := ac.SetBrake(ctx, false); err != nil {
		t.Fatal(err)
	}
	resp, data = e.post(e.key, "image/png", pngBytes(t, 8, 8))
	decodeOK(t, resp, data)
	b, err = ac.Budget(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Manual || b.Engaged {
		t.Errorf("budget after brake off: %+v", b)
	}
}

func TestBackupWhileServingUnderLoad(t *testing.T) {
	e := newEnv(t, envOptions{quota: 1 << 30, budget: budget.Config{DailyRequests: 1 << 30}})
	ac := adminClient(e)
	var keys []string
	for i := range 10 {
		keys = append(keys, e.newKey(fmt.Sprintf("load-%d", i), ""))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served atomic.Int64
	img := pngBytes(t, 8, 8)
	for i := range 16 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, _ := e.post(keys[(i+n)%len(keys)], "image/png", img)
				if resp.StatusCode == http.StatusOK {
					served.Add(1)
				}
			}
		})
	}
	for served.Load() < 50 {
		runtime.Gosched()
	}
	path := filepath.Join(t.TempDir(), "copy.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ac.Backup(context.Background(), f, path); err != nil {
		t.Fatal(err)
	}
	f.Close()
	close(stop)
	wg.Wait()

	cp, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatalf("the backup does not open: %v", err)
	}
	defer cp.Close()
	used, err := cp.QuotaUsed(budget.MonthKey(time.Now(), time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := cp.Usage(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, n := range used {
		total += n
	}
	// A consistent copy: every counted read has its row, and it holds
	// what was served before it was taken, but not more than in the end.
	if total != int64(len(rows)) || total < 50 || total > served.Load() {
		t.Errorf("backup holds %d counted reads and %d rows; %d served in all", total, len(rows), served.Load())
	}
	if keysInCopy, _ := cp.Keys(); len(keysInCopy) != 11 {
		t.Errorf("backup holds %d keys, want 11", len(keysInCopy))
	}
}
