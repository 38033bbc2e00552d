package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage"
)

// childArgs, when set in the environment, makes the test binary run
// breakwater itself instead of the tests (TestMain): the crash test kills
// that child.
const childArgs = "BREAKWATER_TEST_CHILD_ARGS"

// TestCrashKeepsReservation kills the server (SIGKILL) while an upstream
// call is in flight, after its budget reservation was committed and before
// it was settled. After a restart the reservation still counts: with a
// ceiling of one call a day, the next request is refused without an
// upstream call.
func TestCrashKeepsReservation(t *testing.T) {
	var calls atomic.Int64
	called := make(chan struct{}, 10)
	release := make(chan struct{})
	gemini := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		called <- struct{}{}
		select { // hold the first call until the server is dead
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer gemini.Close()
	defer close(release)

	dir := t.TempDir()
	dbPath := filepath.Join(dir, "bw.db")
	addr := freeAddr(t) // the child's: a process of its own cannot be asked
	path := writeConfig(t, fmt.Sprintf(`
[server]
listen = %q
[storage]
path = %q
[ocr]
base_url = %q
timeout = "60s"
[budget]
daily_requests = 1
[plans.free]
monthly_quota = 10
`, addr, dbPath, gemini.URL))

	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "create", "--user", "crash", "--config", path}, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	key := lines[len(lines)-1]

	logs := &lockedBuffer{}
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childArgs+"=serve --config "+path, "GEMINI_API_KEY=test-key")
	child.Stderr = logs
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	if status := waitUp(t, "http://"+addr+"/healthz", exited); status != http.StatusOK {
		t.Fatalf("the child's healthz: %d; its log:\n%s", status, logs.String())
	}

	img := samplePNG(t)
	go postImage(addr, key, img) // its answer never comes: the server dies
	select {
	case <-called:
	case <-time.After(15 * time.Second):
		t.Fatalf("the upstream was never called; child log:\n%s", logs.String())
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited

	db, err := storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	today := budget.DayKey(time.Now(), time.UTC)
	day, _ := db.Budget(today)
	open, _ := db.OpenReservations()
	db.Close()
	if day.Requests != 1 || day.SpendMicroUSD <= 0 || open != 0 {
		t.Fatalf("after the crash: %+v with %d open reservation rows; want 1 request at its worst case (a lease of one call, which keeps no row)", day, open)
	}

	// Restart: the reservation made before the crash still counts.
	a, _, stop := startApp(t, path, envFrom(map[string]string{"GEMINI_API_KEY": "k", "BREAKWATER_SERVER__LISTEN": "127.0.0.1:0"}))
	status, body, err := postImage(a.Addr(), key, img)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "budget_paused") {
		t.Errorf("after restart: %d %s, want 503 budget_paused", status, body)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("%d upstream calls, want 1", got)
	}
	stop()
}
