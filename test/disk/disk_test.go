package disk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"breakwater/storage"
	"breakwater/test/harness"
)

// built is the binary, built once for the package's tests.
var built struct {
	sync.Once
	dir, bin string
	err      error
}

func build(ctx context.Context, root string) (string, error) {
	built.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "disk-test-"); built.err == nil {
			built.bin, built.err = harness.Build(ctx, root, built.dir)
		}
	})
	return built.bin, built.err
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// adminToken opens the admin API, for /metrics.
const adminToken = "disk-test-admin-token-0123456789abcdef"

// rig is one server under test with its fake Gemini and what its clients
// received.
type rig struct {
	t      *testing.T
	bin    string
	config string
	dbPath string
	gemini *harness.Gemini
	proc   *harness.Process
	key    string
	img    []byte
	client *http.Client
	ok     []string // request ids of the 200s received
	logs   int
}

func newRig(t *testing.T, dataDir string) *rig {
	t.Helper()
	ctx := context.Background()
	root, err := harness.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, err := build(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	g, err := harness.NewGemini(root, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	r := &rig{
		t: t, bin: bin, config: filepath.Join(dir, "config.toml"), dbPath: filepath.Join(dataDir, "breakwater.db"),
		gemini: g, img: harness.PNG(), client: &http.Client{Timeout: 20 * time.Second},
	}
	err = harness.WriteConfig(r.config, harness.Config{DBPath: r.dbPath, GeminiURL: g.URL, DailyRequests: 100000, Plan: "disk"})
	if err != nil {
		t.Fatal(err)
	}
	if r.key, err = harness.CreateKey(ctx, bin, r.config, "disk-user", "disk"); err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs the server; it is killed at the end of the test.
func (r *rig) start() {
	r.t.Helper()
	r.logs++
	p, err := harness.Start(r.bin, r.config, filepath.Join(filepath.Dir(r.config), fmt.Sprintf("server-%d.log", r.logs)),
		"GEMINI_API_KEY=disk-test", "BREAKWATER_ADMIN_TOKEN="+adminToken)
	if err != nil {
		r.t.Fatal(err)
	}
	r.proc = p
	r.t.Cleanup(p.Kill)
}

// post sends one read and keeps the request id of a 200.
func (r *rig) post() harness.Answer {
	a := harness.Post(context.Background(), r.client, r.proc.Addr, r.key, r.img)
	if a.Status == http.StatusOK {
		r.ok = append(r.ok, a.RequestID)
	}
	return a
}

func (r *rig) calls() int64 {
	_, n := r.gemini.Calls()
	return n
}

// readsOK makes n reads that must succeed.
func (r *rig) readsOK(n int) {
	r.t.Helper()
	for range n {
		if a := r.post(); a.Status != http.StatusOK {
			r.t.Fatalf("read: %d %s %v; log:\n%s", a.Status, a.Code, a.Err, harness.Tail(r.proc.LogPath))
		}
	}
}

// untilUnavailable reads until a usage record fails (503
// usage_unavailable), from fillClients clients at once, each image a new
// one (a repeated image would wait for its twin's answer), and returns
// once every client has had its last answer, so that none is in flight
// when the pause's checks begin. Every other answer must be a 200.
func (r *rig) untilUnavailable(max int) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var (
		mu          sync.Mutex
		sent        int
		unavailable bool
		bad         []string
		wg          sync.WaitGroup
	)
	for range fillClients {
		wg.Go(func() {
			for {
				mu.Lock()
				if unavailable || len(bad) > 0 || sent >= max || time.Now().After(deadline) {
					mu.Unlock()
					return
				}
				sent++
				n := sent
				mu.Unlock()
				a := harness.Post(context.Background(), r.client, r.proc.Addr, r.key, harness.NthPNG(uint64(n)))
				mu.Lock()
				switch {
				case a.Status == http.StatusOK:
					r.ok = append(r.ok, a.RequestID)
				case a.Status == http.StatusServiceUnavailable && a.Code == "usage_unavailable":
					if !unavailable {
						r.t.Logf("the usage record failed after %d more reads", n)
					}
					unavailable = true
				default:
					bad = append(bad, fmt.Sprintf("read %d: %d %s %v", n, a.Status, a.Code, a.Err))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	switch {
	case len(bad) > 0:
		r.t.Fatalf("%s; log:\n%s", strings.Join(bad, "; "), harness.Tail(r.proc.LogPath))
	case !unavailable:
		r.t.Fatalf("no usage record failed within %d reads; log:\n%s", sent, harness.Tail(r.proc.LogPath))
	}
}

// fillClients is how many clients fill the disk with reads: some seven
// thousand reads fill it, a minute's worth one at a time.
const fillClients = 4

// paused checks that the pause holds: n reads refused with 503
// usage_unavailable and a Retry-After, before any upstream call.
func (r *rig) paused(n int) {
	r.t.Helper()
	before := r.calls()
	for range n {
		a := r.post()
		if a.Status != http.StatusServiceUnavailable || a.Code != "usage_unavailable" || a.RetryAfter < 1 {
			r.t.Fatalf("during the pause: %d %s Retry-After %d; want 503 usage_unavailable with Retry-After", a.Status, a.Code, a.RetryAfter)
		}
	}
	if got := r.calls(); got != before {
		r.t.Errorf("%d upstream calls during the pause, want none", got-before)
	}
}

// resumes polls until a read succeeds again, at most within limit.
func (r *rig) resumes(limit time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		a := r.post()
		switch {
		case a.Status == http.StatusOK:
			return
		case a.Status == http.StatusServiceUnavailable && a.Code == "usage_unavailable":
		default:
			r.t.Fatalf("while waiting to resume: %d %s %v", a.Status, a.Code, a.Err)
		}
		time.Sleep(250 * time.Millisecond) // a poll: the pause ends on the server's clock
	}
	r.t.Fatalf("the service did not resume within %s; log:\n%s", limit, harness.Tail(r.proc.LogPath))
}

// failOpens reads breakwater_layer_failopen_total{layer} from /metrics.
func (r *rig) failOpens(layer string) float64 {
	r.t.Helper()
	var addr string
	for deadline := time.Now().Add(5 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		addr = r.proc.AdminAddr()
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	want := `breakwater_layer_failopen_total{layer="` + layer + `"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), want); found {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// checkDB reads the database; call it with the server stopped. The database
// must pass bbolt's consistency check, hold a usage row for every 200,
// and quota counts equal to its rows.
func (r *rig) checkDB() {
	r.t.Helper()
	db, err := storage.Open(r.dbPath, storage.Options{Timeout: 5 * time.Second, Check: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		r.t.Fatalf("the database after the disk failed: %v", err)
	}
	defer db.Close()
	rows, err := db.Usage(time.Time{}, time.Time{})
	if err != nil {
		r.t.Fatal(err)
	}
	have := map[string]bool{}
	for _, row := range rows {
		have[row.RequestID] = true
	}
	for _, id := range r.ok {
		if !have[id] {
			r.t.Errorf("a 200 without a usage row: request %s", id)
		}
	}
	var used int64
	now := time.Now().UTC()
	for _, m := range []time.Time{now.AddDate(0, -1, 0), now, now.AddDate(0, 1, 0)} {
		q, err := db.QuotaUsed(m.Format("2006-01"))
		if err != nil {
			r.t.Fatal(err)
		}
		used += q["disk-user"]
	}
	if used != int64(len(rows)) {
		r.t.Errorf("quota used %d, usage rows %d", used, len(rows))
	}
	r.t.Logf("database: %d usage rows, %d 200s received, quota %d", len(rows), len(r.ok), used)
}

// mount runs mount(8) and unmounts at cleanup. A mount that fails fails
// the test: these tests exist to run for real.
func mount(t *testing.T, dir string, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", append(args, dir)...).CombinedOutput(); err != nil {
		t.Fatalf("mount %s %s: %v: %s (these tests need root and a kernel that allows it; they do not skip)",
			strings.Join(args, " "), dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// fill writes a file into dir until the filesystem has no byte left.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for i := 0; i < 1<<20; i++ {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return path
			}
			t.Fatal(err)
		}
	}
	t.Fatal("the filesystem never filled up")
	return ""
}

// TestFullDisk puts the database on an 8 MiB tmpfs and fills it while the
// server runs: the read whose usage record cannot be written answers 503
// usage_unavailable and no result, paid calls pause (refused before any
// upstream call), the defense layers fail open, nothing committed is lost,
// and once space is freed the service resumes by itself.
func TestFullDisk(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mount(t, mnt, "-t", "tmpfs", "-o", "size=8m", "tmpfs")
	r := newRig(t, mnt)
	r.start()
	r.readsOK(20)

	filler := fill(t, mnt)
	r.untilUnavailable(20000)
	r.paused(20)

	// The pause ends with the disk still full: one request alone probes,
	// the defense layers let it through to its call, and its record fails
	// again, unless it fits in pages bbolt already holds in its file
	// (pages freed since the failure are reused without the file
	// growing): then it is a 200 whose row checkDB finds below.
	before := r.calls()
	for deadline := time.Now().Add(15 * time.Second); r.calls() == before; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no probe reached the upstream after the pause")
		}
		switch a := r.post(); {
		case a.Status == http.StatusOK && r.calls() > before:
			t.Logf("the probe's record fitted in the file's free pages: 200")
		case a.Status != http.StatusServiceUnavailable || a.Code != "usage_unavailable":
			t.Fatalf("disk still full: %d %s, want 503 usage_unavailable", a.Status, a.Code)
		}
	}
	if got := r.calls() - before; got != 1 {
		t.Errorf("%d probes reached the upstream, want 1", got)
	}
	// Whether the small writes of the defense layers (the reservation,
	// the write-behind) failed too depends on the free pages bbolt holds
	// in its file; each that failed was counted and let the read through.
	t.Logf("fail-open counts on the full disk: budget %v, rate %v, attempts %v",
		r.failOpens("budget"), r.failOpens("rate"), r.failOpens("attempts"))

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	r.resumes(30 * time.Second)
	r.readsOK(5)
	r.proc.Stop(15 * time.Second)
	r.checkDB()
}

// TestReadOnlyDisk puts the database on ext4 on a loop device mounted with
// errors=remount-ro, and turns the filesystem read-only under the running
// server the way the kernel does after a disk error. (A plain `mount -o
// remount,ro` is refused with EBUSY while the server holds the file open
// for writing.) The reads then answer 503 usage_unavailable without an
// upstream call, the pause holds; after the operator remounts, the
// database is whole and the service answers again. Then the filesystem is
// remounted read-only with the server stopped: the server refuses to
// start, and starts once it is writable.
func TestReadOnlyDisk(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	mnt := filepath.Join(dir, "ext4")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "truncate", "-s", "32M", img)
	run(t, "mkfs.ext4", "-q", "-F", img)
	dev := run(t, "losetup", "--find", "--show", img)
	t.Cleanup(func() { exec.Command("losetup", "--detach", dev).Run() })
	mount(t, mnt, "-t", "ext4", "-o", "errors=remount-ro", dev)

	r := newRig(t, mnt)
	r.start()
	r.readsOK(20)

	// The kernel's own path to a read-only filesystem: an error on a
	// filesystem mounted errors=remount-ro.
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("1"), 0o200); err != nil {
		t.Fatalf("turn %s read-only: %v", mnt, err)
	}
	before := r.calls()
	if a := r.post(); a.Status != http.StatusServiceUnavailable || a.Code != "usage_unavailable" {
		t.Fatalf("read-only disk: %d %s, want 503 usage_unavailable", a.Status, a.Code)
	}
	// The read's call was covered by the budget lease written before the
	// disk failed, so at most that one call was bought (its usage record
	// then failed, and the result was withheld); once the budget needs a
	// write, none is: a lease the disk refuses refuses the call.
	if got := r.calls() - before; got > 1 {
		t.Errorf("%d upstream calls for the read, want at most the one the lease covered", got)
	}
	r.paused(20)

	// The operator's way back: stop, remount (ext4 replays its journal),
	// check, start.
	r.proc.Stop(15 * time.Second)
	run(t, "umount", mnt)
	run(t, "mount", "-t", "ext4", "-o", "errors=remount-ro", dev, mnt)
	r.checkDB()
	r.start()
	r.readsOK(5)
	r.proc.Stop(15 * time.Second)

	// Read-only at start: refused, with the reason.
	run(t, "mount", "-o", "remount,ro", mnt)
	logPath := filepath.Join(dir, "ro-start.log")
	if p, err := harness.Start(r.bin, r.config, logPath, "GEMINI_API_KEY=disk-test"); err == nil {
		p.Kill()
		t.Fatal("the server started on a read-only filesystem")
	}
	if log := harness.Tail(logPath); !strings.Contains(log, "read-only file system") {
		t.Errorf("start on a read-only filesystem; log does not name it:\n%s", log)
	}
	run(t, "mount", "-o", "remount,rw", mnt)
	r.start()
	r.readsOK(5)
	r.proc.Stop(15 * time.Second)
	r.checkDB()
}
