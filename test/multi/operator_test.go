package multi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// propagationBound is how soon an operator's change made through one
// instance must be in force on the other.
const propagationBound = time.Second

// TestOperatorChangesReachTheOtherInstance: a key revoked through A's
// admin API is refused by B within a second; the brake switched on
// through B's admin API refuses on A within a second; a user banned
// through B is refused by A; the brake switched through the CLI holds on
// both. Each delay is measured from the change's answer to the first
// request that shows it, and printed.
func TestOperatorChangesReachTheOtherInstance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPair(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 100000}, 2, 0)
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 2 { // both keys work on both instances
		for u := range 2 {
			if r := p.send(ctx, client, i, u, nil); r.answer.Status != http.StatusOK {
				t.Fatalf("user%d on instance %d: %d %s\n%s", u, i, r.answer.Status, r.answer.Code, p.logs())
			}
		}
	}

	p.admin(ctx, t, 0, "/api/keys/"+p.keys[0].ID+"/revoke", "")
	changed := time.Now()
	d := p.until(ctx, t, changed, 1, 0, http.StatusUnauthorized, "")
	t.Logf("key revoked through A: refused by B after %v", d)
	if r := p.send(ctx, client, 1, 1, nil); r.answer.Status != http.StatusOK {
		t.Errorf("another user's key on B after the revocation: %d %s, want 200", r.answer.Status, r.answer.Code)
	}

	p.admin(ctx, t, 1, "/api/brake", `{"on":true}`)
	changed = time.Now()
	d = p.until(ctx, t, changed, 0, 1, http.StatusServiceUnavailable, "paused_by_operator")
	t.Logf("brake on through B: refused by A after %v", d)
	p.admin(ctx, t, 1, "/api/brake", `{"on":false}`)
	changed = time.Now()
	d = p.until(ctx, t, changed, 0, 1, http.StatusOK, "")
	t.Logf("brake off through B: A serves again after %v", d)

	p.admin(ctx, t, 1, "/api/users/user1", `{"banned":true}`)
	changed = time.Now()
	d = p.until(ctx, t, changed, 0, 1, http.StatusForbidden, "banned")
	t.Logf("user banned through B: refused by A after %v", d)
	p.admin(ctx, t, 0, "/api/users/user1", `{"banned":false}`)
	changed = time.Now()
	d = p.until(ctx, t, changed, 1, 1, http.StatusOK, "")
	t.Logf("user unbanned through A: B serves again after %v", d)

	// The CLI works on the database itself: both instances follow it.
	if _, err := harness.Command(ctx, bin, p.config, p.env, "brake", "on"); err != nil {
		t.Fatal(err)
	}
	changed = time.Now()
	for i := range 2 {
		d = p.until(ctx, t, changed, i, 1, http.StatusServiceUnavailable, "paused_by_operator")
		t.Logf("brake on through the CLI: refused by instance %d after %v", i, d)
	}
	if _, err := harness.Command(ctx, bin, p.config, p.env, "brake", "off"); err != nil {
		t.Fatal(err)
	}
	changed = time.Now()
	for i := range 2 {
		d = p.until(ctx, t, changed, i, 1, http.StatusOK, "")
		t.Logf("brake off through the CLI: instance %d serves again after %v", i, d)
	}
}

// admin posts body to instance i's admin API at path and fails t unless
// it answers 200.
func (p *pair) admin(ctx context.Context, t *testing.T, i int, path, body string) {
	t.Helper()
	addr := p.proc(i).AdminAddr()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s on instance %d: %d %s", path, i, resp.StatusCode, out)
	}
}

// until sends user's requests to instance i until one answers status (and
// code, if not empty), and returns how long after start that was; it fails t past
// propagationBound (it keeps trying for a few seconds more, to say how
// late the change came).
func (p *pair) until(ctx context.Context, t *testing.T, start time.Time, i, user, status int, code string) time.Duration {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var last harness.Answer
	for time.Since(start) < propagationBound+5*time.Second {
		last = p.send(ctx, client, i, user, nil).answer
		if last.Status == status && (code == "" || last.Code == code) {
			d := time.Since(start)
			if d > propagationBound {
				t.Errorf("the change took %v to reach instance %d, want at most %v", d, i, propagationBound)
			}
			return d
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("instance %d still answers %d %s after %v, want %d %s\n%s", i, last.Status, last.Code, time.Since(start), status, code, p.logs())
	return 0
}

// TestIdempotentRetryOnTheOtherInstance: a read sent to A with an
// Idempotency-Key and retried on B gets A's answer byte for byte, and is
// charged once: one upstream call, one usage row.
func TestIdempotentRetryOnTheOtherInstance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPair(t, pgtest.NewDatabase(t), harness.Config{DailyRequests: 100000}, 1, 0)
	client := &http.Client{Timeout: 10 * time.Second}
	img := harness.NthPNG(imageSeq.Add(1))
	h := http.Header{"Idempotency-Key": {fmt.Sprintf("retry-%d", time.Now().UnixNano())}}
	first := harness.PostHeader(ctx, client, p.proc(0).Addr, p.keys[0].Secret, img, h)
	retry := harness.PostHeader(ctx, client, p.proc(1).Addr, p.keys[0].Secret, img, h)
	if first.Status != http.StatusOK || retry.Status != http.StatusOK {
		t.Fatalf("first on A: %d %s; retry on B: %d %s\n%s", first.Status, first.Code, retry.Status, retry.Code, p.logs())
	}
	if !bytes.Equal(first.Body, retry.Body) {
		t.Errorf("the retry's body differs from the first answer's:\n%s\n%s", first.Body, retry.Body)
	}
	p.stopAll()
	_, upstream := p.gemini.Calls()
	b := readBooks(t, p.dbURL)
	if upstream != 1 || b.rowCount != 1 || b.rows[first.RequestID] != 1 {
		t.Errorf("%d upstream calls, %d usage rows (%d for the first request), want 1 each", upstream, b.rowCount, b.rows[first.RequestID])
	}
}

// TestStartTogetherOnAFreshDatabase: two instances started at the same
// moment on an empty database both come up (one migrates the schema under
// the advisory lock, the other waits and finds it done), and a key the
// CLI creates afterwards works on both.
func TestStartTogetherOnAFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dbURL := pgtest.NewDatabase(t)
	p := newPair(t, dbURL, harness.Config{DailyRequests: 100000}, 0, 0)
	k, err := harness.NewKey(ctx, bin, p.config, "late", plan, p.env...)
	if err != nil {
		t.Fatal(err)
	}
	p.keys = append(p.keys, k)
	for i := range 2 {
		d := p.until(ctx, t, time.Now(), i, 0, http.StatusOK, "")
		t.Logf("a key created by the CLI after both started: served by instance %d after %v", i, d)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var migrations int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM breakwater_schema").Scan(&migrations); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("storage/postgres/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("the migrations: %v %v", files, err)
	}
	if migrations != len(files) {
		t.Errorf("breakwater_schema records %d migrations, want each of the %d once", migrations, len(files))
	}
}
