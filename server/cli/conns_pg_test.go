package cli_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// smallServer is a cluster of the test's own with few connections: 20,
// 3 of them reserved to superusers, and a database bw owned by the
// ordinary role bw; it returns the cluster and bw's URL for a database.
func smallServer(t *testing.T) (*pgtest.Cluster, func(db string) string) {
	t.Helper()
	c := pgtest.NewClusterWith(t, pgtest.Options{Settings: []string{"max_connections=20", "superuser_reserved_connections=3"}})
	execAs(t, c.URL("postgres"), "CREATE ROLE bw LOGIN")
	execAs(t, c.URL("postgres"), "CREATE DATABASE bw OWNER bw")
	return c, func(db string) string {
		return fmt.Sprintf("postgres://bw@127.0.0.1:%d/%s?sslmode=disable", c.Port(), db)
	}
}

// holdConns opens connections to url until the server refuses one for
// too many clients (or n are open, n > 0); it returns how many it holds
// and a release that closes them (at the test's end at the latest).
func holdConns(t *testing.T, url string, n int) (int, func()) {
	t.Helper()
	var conns []*pgx.Conn
	var once sync.Once
	release := func() {
		once.Do(func() {
			for _, c := range conns {
				c.Close(context.Background())
			}
		})
	}
	t.Cleanup(release)
	for n <= 0 || len(conns) < n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := pgx.Connect(ctx, url)
		cancel()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "53300" {
			break
		}
		if err != nil {
			t.Fatalf("hold a connection: %v", err)
		}
		conns = append(conns, conn)
		if len(conns) > 100 {
			t.Fatal("the server never refused a connection")
		}
	}
	return len(conns), release
}

var roomLine = regexp.MustCompile(`room for (\d+) instances? at their full pool`)

// config check says how many instances with the configured pool fit in
// the server's connections beside its other clients, and warns when one
// more than those running would not fit.
func TestConfigCheckCountsConnections(t *testing.T) {
	t.Parallel() // a cluster of its own: its start is mostly waiting
	_, url := smallServer(t)
	env := map[string]string{postgres.EnvURL: url("bw"), "BREAKWATER_SECRET": migrateSecret}
	config := func(pool int) string {
		return writeConfig(t, instancesTOML(t)+fmt.Sprintf(`postgres_max_connections = %d
[server]
listen = "127.0.0.1:0"
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
`, pool))
	}
	room := func(out string) int {
		m := roomLine.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("config check says no room for instances:\n%s", out)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	small := config(4)
	out, err := cliRun(small, env, "config", "check")
	if err != nil {
		t.Fatalf("config check: %v\n%s", err, out)
	}
	if !strings.Contains(out, "max_connections 20 less 3 reserved") || room(out) != 17/5 || strings.Contains(out, "could exhaust") {
		t.Errorf("an idle server, a pool of 4: want room for %d instances and no warning:\n%s", 17/5, out)
	}
	// The default pool of 16 on this server leaves room for one instance.
	out, err = cliRun(config(0), env, "config", "check")
	if err != nil || room(out) != 17/17 || strings.Contains(out, "could exhaust") {
		t.Errorf("the default pool: %v, want room for one instance and no warning:\n%s", err, out)
	}
	// One instance running, and other clients holding 10 connections:
	// (17 - 10) / 5 leaves room for one, which is taken.
	out, err = cliRun(small, env, "keys", "create", "--user", "alice", "--plan", "free")
	if err != nil {
		t.Fatalf("keys create: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	a, _, stop := startApp(t, small, envFrom(env))
	defer stop()
	// The instance keeps to its pool under a burst of reads: at most 4
	// connections and its listener.
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = postImage(a.Addr(), lines[len(lines)-1], labelPNG(t, uint8(i)))
		}()
	}
	wg.Wait()
	most := breakwaterConns(t, url("bw"))
	if most > 4+1 {
		t.Errorf("the instance holds %d connections after a burst, want at most storage.postgres_max_connections (4) and its listener", most)
	}
	holdConns(t, url("postgres"), 10) // released at the end
	out, err = cliRun(small, env, "config", "check")
	if err != nil {
		t.Fatalf("config check: %v\n%s", err, out)
	}
	if room(out) != 1 || !strings.Contains(out, "1 instance running") || !strings.Contains(out, "warning: the server's connections leave room for 1 instance") {
		t.Errorf("one instance running and 10 connections held: want room for 1 and a warning:\n%s", out)
	}
}

// A server at max_connections: an instance whose connections were cut
// gets no new one. A read is refused at once (503), with no upstream
// call, and the log says why once, not per request; once connections
// free up, reads go on.
func TestNoConnectionLeftFailsClosed(t *testing.T) {
	t.Parallel() // a cluster of its own: its start is mostly waiting
	c, url := smallServer(t)
	gemini, called := slowGemini(t, 0)
	config := writeConfig(t, instancesTOML(t)+fmt.Sprintf(`postgres_max_connections = 4
[server]
listen = "127.0.0.1:0"
[ocr]
base_url = %q
[plans.free]
monthly_quota = 100
[limits.user]
rate = 1000
burst = 100
`, gemini.URL))
	env := map[string]string{postgres.EnvURL: url("bw"), "BREAKWATER_SECRET": migrateSecret, "GEMINI_API_KEY": "test-key"}
	out, err := cliRun(config, env, "keys", "create", "--user", "alice", "--plan", "free")
	if err != nil {
		t.Fatalf("keys create: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	key := lines[len(lines)-1]
	a, logs, stop := startApp(t, config, envFrom(env))
	defer stop()
	if status, body, err := postImage(a.Addr(), key, labelPNG(t, 1)); err != nil || status != http.StatusOK {
		t.Fatalf("a read before: %d %s %v", status, body, err)
	}
	<-called

	// The instance's sessions end, and other clients take every slot.
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "ALTER DATABASE bw ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = 'bw'"); err != nil {
		t.Fatal(err)
	}
	held, release := holdConns(t, url("postgres"), 0)
	if _, err := admin.Exec(ctx, "ALTER DATABASE bw ALLOW_CONNECTIONS true"); err != nil {
		t.Fatal(err)
	}
	t.Logf("the test holds %d connections", held)

	const reads = 6
	var slowest time.Duration
	for i := range reads {
		start := time.Now()
		status, body, err := postImage(a.Addr(), key, labelPNG(t, uint8(10+i)))
		took := time.Since(start)
		if err != nil || status != http.StatusServiceUnavailable {
			t.Fatalf("read %d with no connection to be had: %d %s %v, want 503", i, status, body, err)
		}
		slowest = max(slowest, took)
		if took > 5*time.Second {
			t.Errorf("read %d took %v to be refused: want a bounded wait, not a hang", i, took)
		}
	}
	t.Logf("the slowest of %d refusals took %v", reads, slowest.Round(time.Millisecond))
	if n := len(called); n != 0 {
		t.Errorf("%d upstream calls with no connection to be had, want none", n)
	}
	said := strings.Count(logs.String(), "too many clients (max_connections reached)")
	if said != 1 {
		t.Errorf("the log says %d times that the server has no connection left, want once (at most once a minute):\n%s", said, logs.String())
	}

	// Connections free up: reads go on.
	release()
	freed := time.Now()
	deadline := freed.Add(20 * time.Second)
	for i := 0; ; i++ {
		status, body, err := postImage(a.Addr(), key, labelPNG(t, uint8(100+i)))
		if err == nil && status == http.StatusOK {
			t.Logf("reads go on %v after the connections free up", time.Since(freed).Round(10*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reads do not go on once connections free up: %d %s %v", status, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// breakwaterConns counts the connections Breakwater's instances hold.
func breakwaterConns(t *testing.T, url string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'breakwater'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
