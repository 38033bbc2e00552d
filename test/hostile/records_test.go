package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/storage"
	"breakwater/test/harness"
)

// parallelNote: the tests without a legitimate client timed beside a
// flood (TestMemoryPerUser's three and the records tests here) run two
// at a time, after the flood tests, which run one at a time: each has a
// server and a database of its own, and what they assert (the peak
// resident set and memory per key of their own processes, what the
// commands read) does not hang on how long another test takes. The
// users of TestMemoryPerUser wait on a durable write each.
const parallelNote = 0

// The evidence tools (replay, thresholds, usage) against recorded
// traffic far larger than a run of the other scenarios makes: the rows
// are written straight into the database through storage's API, then
// the real binary reads them, through the running server's admin API or
// from the file, each process's peak resident set read from
// /proc/PID/status (VmHWM) and held to a bound.

// hwm is a process's peak resident set so far, from /proc/PID/status;
// 0 once it has exited.
func hwm(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cliRun is one run of a command of the binary: its output, how long it
// took and its peak resident set.
type cliRun struct {
	out, errOut bytes.Buffer
	took        time.Duration
	peak        int64
	err         error
}

// runBounded runs bin with args and env added, reading its peak resident
// set (VmHWM) every 10 ms, and kills it once that passes limit (the test
// then fails: a command that held the recorded rows would take the
// machine's memory).
func runBounded(t *testing.T, bin string, limit int64, env []string, args ...string) *cliRun {
	t.Helper()
	r := &cliRun{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &r.out, &r.errOut
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	var killed atomic.Bool
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if m := hwm(cmd.Process.Pid); m > peak.Load() {
				peak.Store(m)
				if m > limit {
					killed.Store(true)
					_ = cmd.Process.Kill()
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	r.err = cmd.Wait()
	close(stop)
	<-watched
	r.took = time.Since(start)
	// The last reading was at most one interval before the exit. (The
	// child's getrusage maxrss is no substitute: it counts this test
	// process's resident set, which the child shares until its exec.)
	r.peak = peak.Load()
	if killed.Load() {
		t.Fatalf("%s %s: peak resident set %d MiB, over the bound of %d MiB: killed", filepath.Base(bin), args[0], r.peak>>20, limit>>20)
	}
	return r
}

// fill writes rows into a new database at path, through storage's API,
// in batches.
func fill(t *testing.T, path string, rows func(add func(detect.Event))) (events int64) {
	t.Helper()
	db, err := storage.Open(path, storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]detect.Event, 0, 20_000)
	flush := func() {
		if err := db.AppendEvents(batch); err != nil {
			t.Fatal(err)
		}
		events += int64(len(batch))
		batch = batch[:0]
	}
	rows(func(e detect.Event) {
		batch = append(batch, e)
		if len(batch) == cap(batch) {
			flush()
		}
	})
	flush()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return events
}

// fillCommand runs the fill command (built without -race) on the
// database at path with args and returns how many rows it wrote.
func fillCommand(t *testing.T, path string, args ...string) int64 {
	t.Helper()
	serverBinary(t)
	cmd := exec.Command(build.fill, append([]string{"-db", path}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fill %v: %v\n%s", args, err, stderr.Bytes())
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("fill %v: %q", args, out)
	}
	return n
}

// serveDB starts the server on the database at dbPath (a config of
// defaults beside it) and waits for both listeners; it returns the
// process and the path of a config the CLI can use to reach its admin
// API.
func serveDB(t *testing.T, dbPath string) (*harness.Process, string) {
	t.Helper()
	root, bin := serverBinary(t)
	dir := filepath.Dir(dbPath)
	g, err := harness.NewGemini(root, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	config := filepath.Join(dir, "serve.toml")
	if err := writeConfig(config, dbPath, g.URL, defaults); err != nil {
		t.Fatal(err)
	}
	p, err := harness.Start(bin, config, filepath.Join(dir, "server.log"), "GEMINI_API_KEY=test", "BREAKWATER_ADMIN_TOKEN="+adminToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("server log:\n%s", harness.Tail(p.LogPath))
		}
	})
	admin := ""
	for deadline := time.Now().Add(20 * time.Second); admin == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		admin = p.AdminAddr()
	}
	if admin == "" {
		t.Fatalf("no admin listener; log:\n%s", harness.Tail(p.LogPath))
	}
	body, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(dir, "cli.toml")
	body = bytes.Replace(body, []byte(`admin_listen = "127.0.0.1:0"`), []byte(fmt.Sprintf("admin_listen = %q", admin)), 1)
	if err := os.WriteFile(cli, body, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, cli
}

// candidateConfig is config with a tighter [limits.user] and [invites],
// for a replay that judges the recorded requests anew.
func candidateConfig(t *testing.T, config string) string {
	t.Helper()
	body, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(body), "[limits.user]\nrate = ", "[limits.user]\nrate = 20 # was ", 1)
	s = strings.Replace(s, "[invites]\nrate = 1000\nburst = 1000", "[invites]\nrate = 5\nburst = 2", 1)
	path := filepath.Join(t.TempDir(), "candidate.toml")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// thresholdsJSON is what the tests read of thresholds --json.
type thresholdsJSON struct {
	Layers []struct {
		Layer     string `json:"layer"`
		Unflagged struct {
			Keys int
			Max  int64
		} `json:"unflagged"`
		Flagged struct {
			Keys int
			Max  int64
		} `json:"flagged"`
		LeftOut   map[string]int `json:"left_out"`
		Suggested int64          `json:"suggested"`
	} `json:"layers"`
}

// replayJSON is what the tests read of replay --json.
type replayJSON struct {
	Layers []struct {
		Layer     string                            `json:"layer"`
		Current   struct{ Requests, Refused int64 } `json:"current"`
		Candidate struct{ Requests, Refused int64 } `json:"candidate"`
		Note      string                            `json:"note"`
	} `json:"layers"`
}

// H2 (issue 25): replay and thresholds read a million recorded events
// through the running server's admin API. The server built every event
// of the range in its memory (a million: OOM-killed in 1 GiB) and the CLI
// read 16 MiB of it ("unexpected end of JSON input" from 100,000 events);
// now the server streams them a page at a time and the CLI measures them
// as they come, both in bounded memory.
func TestRecordedThroughTheAdminAPI(t *testing.T) {
	t.Parallel() // see parallelNote
	_, bin := serverBinary(t)
	dbPath := filepath.Join(t.TempDir(), "breakwater.db")
	now := time.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	const users, perUser = 10_000, 100
	// Each user's requests, 800 s apart, all day; written in time order,
	// as the recorder does (the fill command, without -race).
	stored := fillCommand(t, dbPath, "-mode", "events", "-users", itoa(users), "-per-user", itoa(perUser),
		"-day", day.Format("2006-01-02"), "-plan", plan)
	if stored != users*perUser {
		t.Fatalf("stored %d events", stored)
	}
	info, err := os.Stat(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	p, cli := serveDB(t, dbPath)
	before := hwm(p.PID())
	env := []string{"BREAKWATER_ADMIN_TOKEN=" + adminToken}
	dayFlag := day.Format("2006-01-02")

	const cliBound = 200 << 20
	th := runBounded(t, bin, cliBound, env, "thresholds", "--config", cli, "--days", "1", "--to", dayFlag, "--json")
	var rep thresholdsJSON
	if th.err != nil {
		t.Errorf("thresholds: %v\n%s", th.err, th.errOut.String())
	} else if err := json.Unmarshal(th.out.Bytes(), &rep); err != nil {
		t.Errorf("thresholds --json: %v\n%.2000s", err, th.out.String())
	} else if got := rep.Layers[0]; got.Layer != "rate" || got.Unflagged.Keys != users {
		t.Errorf("thresholds measured %+v, want the %d users", got, users)
	}
	rp := runBounded(t, bin, cliBound, env, "replay", "--config", cli, "--candidate", candidateConfig(t, cli), "--from", dayFlag, "--to", dayFlag, "--json")
	var rrep replayJSON
	if rp.err != nil {
		t.Errorf("replay: %v\n%s", rp.err, rp.errOut.String())
	} else if err := json.Unmarshal(rp.out.Bytes(), &rrep); err != nil {
		t.Errorf("replay --json: %v\n%.2000s", err, rp.out.String())
	} else if got := rrep.Layers[0]; got.Current.Requests != stored || got.Candidate.Requests != stored {
		t.Errorf("replay read %+v, want all %d events", got, stored)
	}
	after := hwm(p.PID())
	t.Logf("%d events (database %d MiB): server peak resident set %d MiB before, %d MiB after both commands; thresholds %s at %d MiB, replay %s at %d MiB",
		stored, info.Size()>>20, before>>20, after>>20, th.took.Round(time.Millisecond), th.peak>>20, rp.took.Round(time.Millisecond), rp.peak>>20)
	// The server maps the database file: reading it all raises its
	// resident set by up to the file's size, which the kernel can drop.
	// What it builds must stay small beside that.
	if grown := after - before; grown > info.Size()+64<<20 {
		t.Errorf("the server's peak resident set grew by %d MiB streaming %d events from a %d MiB file, want at most the file and 64 MiB",
			grown>>20, stored, info.Size()>>20)
	}
}

// M1 (issue 25): replay and thresholds read refusals counted per key and
// minute as counts. Twelve million invite refusals from one address in
// ten minutes (stored as ten rows) and a million refusals of one user's
// requests got both commands OOM-killed in 1 GiB (each refusal became a
// record in memory), and thresholds suggested an invite line of a
// million; now both run in the memory of the rows and the keys, and the
// flood is left out of the suggested lines, which say so.
func TestRefusalRowsAsCounts(t *testing.T) {
	t.Parallel() // see parallelNote
	_, bin := serverBinary(t)
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "breakwater.db")
	now := time.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	const flood, userFlood, normalUsers, normalIPs = 12_000_000, 1_000_000, 500, 50
	var refusals int64
	fill(t, dbPath, func(add func(detect.Event)) {
		at := day.Add(time.Hour)
		for m := range 10 {
			minute := at.Add(time.Duration(m) * time.Minute)
			add(detect.Event{Time: minute, IP: "203.0.113.9", Route: detect.RouteInvite, Layer: "invites", Outcome: detect.OutcomeLayerRefused, Count: flood / 10})
			add(detect.Event{Time: minute, UserID: "flooder", Plan: plan, Route: "/v1/ocr", Layer: "rate", Outcome: detect.OutcomeLayerRefused, Count: userFlood / 10})
			refusals += flood/10 + userFlood/10
			for s := range 20 {
				add(detect.Event{Time: minute.Add(time.Duration(s) * time.Second), UserID: "flooder", Plan: plan, Route: "/v1/ocr", Outcome: "ok"})
			}
		}
		// Normal traffic: each user 20 reads a few minutes apart, each
		// address 3 invite checks.
		for i := range 20 {
			for u := range normalUsers {
				add(detect.Event{Time: at.Add(time.Duration(i*normalUsers+u) * 300 * time.Millisecond), UserID: fmt.Sprintf("user-%03d", u), Plan: plan,
					Route: "/v1/ocr", Outcome: "ok", Status: 200})
			}
		}
		for i := range 3 {
			for ip := range normalIPs {
				add(detect.Event{Time: at.Add(time.Duration(i*normalIPs+ip) * 10 * time.Second), IP: fmt.Sprintf("192.0.2.%d", ip+1), UserID: "a@example.com",
					Route: detect.RouteInvite, Outcome: "ok"})
			}
		}
	})
	info, err := os.Stat(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.toml")
	if err := writeConfig(config, dbPath, "http://127.0.0.1:1", defaults); err != nil {
		t.Fatal(err)
	}
	dayFlag := day.Format("2006-01-02")
	const bound = 128 << 20

	th := runBounded(t, bin, bound, nil, "thresholds", "--config", config, "--days", "1", "--to", dayFlag, "--json")
	if th.err != nil {
		t.Fatalf("thresholds: %v\n%s", th.err, th.errOut.String())
	}
	var rep thresholdsJSON
	if err := json.Unmarshal(th.out.Bytes(), &rep); err != nil {
		t.Fatalf("thresholds --json: %v\n%.2000s", err, th.out.String())
	}
	text := runBounded(t, bin, bound, nil, "thresholds", "--config", config, "--days", "1", "--to", dayFlag)
	rp := runBounded(t, bin, bound, nil, "replay", "--config", config, "--candidate", candidateConfig(t, config), "--from", dayFlag, "--to", dayFlag, "--json")
	if rp.err != nil {
		t.Fatalf("replay: %v\n%s", rp.err, rp.errOut.String())
	}
	var rrep replayJSON
	if err := json.Unmarshal(rp.out.Bytes(), &rrep); err != nil {
		t.Fatalf("replay --json: %v\n%.2000s", err, rp.out.String())
	}
	t.Logf("%d refusals in a %d KiB database: thresholds %s at %d MiB, replay %s at %d MiB", refusals, info.Size()>>10,
		th.took.Round(time.Millisecond), th.peak>>20, rp.took.Round(time.Millisecond), rp.peak>>20)
	t.Logf("thresholds:\n%s", text.out.String())

	for _, l := range rep.Layers {
		switch l.Layer {
		case "invites":
			if l.Suggested == 0 || l.Suggested > 10 || l.Unflagged.Keys != normalIPs {
				t.Errorf("invites: suggested %d over %+v, want a line above the %d addresses' 3 checks, not the flood's", l.Suggested, l.Unflagged, normalIPs)
			}
			if l.Flagged.Keys != 1 || l.Flagged.Max < flood/10 || l.LeftOut["refused by a limit"] != 1 {
				t.Errorf("invites: left out %+v %v, want the flood, refused by a limit", l.Flagged, l.LeftOut)
			}
		case "rate":
			if l.Unflagged.Keys != normalUsers || l.Flagged.Keys != 1 || l.Flagged.Max < userFlood/10 || l.Suggested > 10 {
				t.Errorf("rate: %+v / %+v, suggested %d: want the %d users measured and the flooder left out", l.Unflagged, l.Flagged, l.Suggested, normalUsers)
			}
		}
	}
	if !strings.Contains(text.out.String(), "invites: left out of the suggested line: 1 key (1 refused by a limit)") {
		t.Errorf("the text does not say what it left out:\n%s", text.out.String())
	}
	for _, l := range rrep.Layers {
		switch l.Layer {
		case "invites":
			if l.Current.Requests != flood+3*normalIPs || l.Current.Refused != flood || l.Candidate.Requests != flood+3*normalIPs || l.Candidate.Refused < flood-1000 {
				t.Errorf("replay invites %+v", l)
			}
		case "rate":
			if l.Current.Refused != userFlood || l.Candidate.Refused < userFlood-1000 {
				t.Errorf("replay rate %+v", l)
			}
		}
	}
}

// H2 (issue 25): breakwater usage lists 100,000 users while the server
// runs. The CLI read at most 16 MiB of an admin answer, and this one is
// about 18 MB: "unexpected end of JSON input"; now it reads answers of
// any size.
func TestUsageOfManyUsers(t *testing.T) {
	t.Parallel() // see parallelNote
	_, bin := serverBinary(t)
	dbPath := filepath.Join(t.TempDir(), "breakwater.db")
	const users = 100_000
	// Each user with a key (a key is not in the usage list, so the answer
	// is the same), 10,000 in a transaction, by the fill command.
	if n := fillCommand(t, dbPath, "-mode", "users", "-users", itoa(users), "-plan", plan); n != users {
		t.Fatalf("stored %d users", n)
	}
	_, cli := serveDB(t, dbPath)
	r := runBounded(t, bin, 256<<20, []string{"BREAKWATER_ADMIN_TOKEN=" + adminToken}, "usage", "--config", cli, "--json")
	if r.err != nil {
		t.Fatalf("usage: %v\n%s", r.err, r.errOut.String())
	}
	var list []struct {
		User string `json:"user"`
	}
	if err := json.Unmarshal(r.out.Bytes(), &list); err != nil {
		t.Fatalf("usage --json: %v", err)
	}
	if len(list) != users {
		t.Errorf("usage listed %d users, want %d", len(list), users)
	}
	t.Logf("usage of %d users (%d MB of JSON) while serving: %s, peak resident set %d MiB", len(list), r.out.Len()/1_000_000, r.took.Round(time.Millisecond), r.peak>>20)
}
