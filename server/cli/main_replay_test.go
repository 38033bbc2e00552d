package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/server/app"
)

// replayDay is the day the replay tests' traffic is sent on, by an
// injected clock.
var replayDay = time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)

// replayConfig is a config on dir's database with layer 1 at rate per
// minute (no burst limit) and the free plan's daily line at daily.
func replayConfig(t *testing.T, dir string, rate, daily int, adminAddr string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	body := fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
admin_listen = %q
[storage]
path = %q
[ocr]
provider = "simulated"
dedupe_window = "0s"
[plans.free]
monthly_quota = 10000
daily_attempts = %d
[limits.user]
rate = %d
window = "1m"
burst = 0
`, adminAddr, filepath.Join(dir, "bw.db"), daily, rate)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// refusalsByKey are the refusals of one run, "layer user" -> count.
type refusalsByKey map[string]int64

// sendTraffic starts the service of the config at path on a clock it
// steps, sends the same requests (three users, one every 7 seconds, the
// third user twice as often) and returns the refusals it answered, then
// stops it.
func sendTraffic(t *testing.T, path, token string) refusalsByKey {
	t.Helper()
	a, keys, clock := openStepped(t, path, envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": token}))
	img := samplePNG(t)
	got := refusalsByKey{}
	at := replayDay
	for i := range 90 {
		user := []string{"alice", "bob", "carol", "carol"}[i%4]
		at = at.Add(7 * time.Second)
		clock.Store(at.UnixNano())
		status, body, err := postImage(a.Addr(), keys[user], img)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case status == http.StatusOK:
		case status == http.StatusTooManyRequests && strings.Contains(body, "rate_limited"):
			got["rate "+user]++
		case status == http.StatusTooManyRequests && strings.Contains(body, "daily_limit"):
			got["attempts "+user]++
		default:
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	a.Close()
	return got
}

// replayOutput is `breakwater replay --json`.
type replayOutput struct {
	From          string `json:"from"`
	To            string `json:"to"`
	DroppedEvents int64  `json:"dropped_events"`
	Layers        []struct {
		Layer     string        `json:"layer"`
		Current   replaySideOut `json:"current"`
		Candidate replaySideOut `json:"candidate"`
	} `json:"layers"`
	Differences []string `json:"differences"`
}

type replaySideOut struct {
	Requests    int64 `json:"requests"`
	Refused     int64 `json:"refused"`
	KeysRefused int64 `json:"keys_refused"`
	Top         []struct {
		Key     string `json:"key"`
		Refused int64  `json:"refused"`
	} `json:"top"`
}

func runReplay(t *testing.T, config, candidate string, env map[string]string, extra ...string) (replayOutput, string) {
	t.Helper()
	day := replayDay.Format("2006-01-02")
	args := append([]string{"replay", "--config", config, "--candidate", candidate, "--from", day, "--to", day}, extra...)
	var out bytes.Buffer
	if err := run(context.Background(), append(args, "--json"), envFrom(env), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var rep replayOutput
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json does not parse: %v\n%s", err, out.String())
	}
	var text bytes.Buffer
	if err := run(context.Background(), args, envFrom(env), &text, io.Discard); err != nil {
		t.Fatal(err)
	}
	return rep, text.String()
}

// candidateRefusals are the candidate's refusals in rep, "layer user" ->
// count.
func candidateRefusals(rep replayOutput) refusalsByKey {
	got := refusalsByKey{}
	for _, l := range rep.Layers {
		for _, k := range l.Candidate.Top {
			got[l.Layer+" "+k.Key] += k.Refused
		}
	}
	return got
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// A replay of traffic recorded under loose limits through a tighter
// candidate reports exactly the refusals that enforcing the candidate
// answers to the same requests; a looser candidate reports none. The
// replay writes nothing to the database, and reads the same through the
// admin API while the server runs.
func TestReplayMatchesAnEnforcingRun(t *testing.T) {
	recorded := t.TempDir()
	adminAddr := freeAddr(t)
	const token = "replay-admin-token"
	current := replayConfig(t, recorded, 100, 1000, adminAddr)
	tight := replayConfig(t, t.TempDir(), 2, 12, freeAddr(t))
	loose := replayConfig(t, t.TempDir(), 1000, 0, freeAddr(t))

	var whileServing replayOutput
	if got := sendTraffic(t, current, token); len(got) != 0 {
		t.Fatalf("the loose run refused %v", got)
	}
	enforced := sendTraffic(t, tight, token)
	if len(enforced) == 0 {
		t.Fatal("the tight config refused nothing: the test proves nothing")
	}
	var layers int
	for k := range enforced {
		if strings.HasPrefix(k, "attempts ") {
			layers |= 1
		} else {
			layers |= 2
		}
	}
	if layers != 3 {
		t.Fatalf("enforced refusals %v: want some at the rate limit and some at the daily line", enforced)
	}

	db := filepath.Join(recorded, "bw.db")
	before := fileSum(t, db)
	rep, text := runReplay(t, current, tight, nil)
	t.Logf("replay:\n%s", text)
	if after := fileSum(t, db); after != before {
		t.Error("the replay changed the database file")
	}
	if got := candidateRefusals(rep); fmt.Sprint(got) != fmt.Sprint(enforced) {
		t.Errorf("replay of the tight candidate refuses %v, the enforcing run %v", got, enforced)
	}
	for _, l := range rep.Layers {
		if l.Current.Refused != 0 {
			t.Errorf("layer %s: the current config refuses %d on replay, want 0 (it refused none when serving)", l.Layer, l.Current.Refused)
		}
	}
	if rep.DroppedEvents != 0 || rep.From != "2026-11-20" || rep.To != "2026-11-20" {
		t.Errorf("report header %+v", rep)
	}
	if !strings.Contains(text, "rate: the candidate would have refused") || !strings.Contains(text, "carol") {
		t.Errorf("the text report lacks the differences in words:\n%s", text)
	}

	lrep, _ := runReplay(t, current, loose, nil)
	for _, l := range lrep.Layers {
		if l.Candidate.Refused != 0 {
			t.Errorf("the looser candidate refuses %d at %s", l.Candidate.Refused, l.Layer)
		}
	}

	// While serving, through the admin API: the same answer.
	cfg, err := app.Load(current, envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Open(context.Background(), cfg, app.Options{Getenv: envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": token}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	whileServing, _ = runReplay(t, current, tight, map[string]string{"BREAKWATER_ADMIN_TOKEN": token})
	if got := candidateRefusals(whileServing); fmt.Sprint(got) != fmt.Sprint(enforced) {
		t.Errorf("while serving, the replay refuses %v, want %v", got, enforced)
	}
}

// thresholds reads the recorded traffic as the layers count it, writes
// nothing, and suggests lines above every unflagged key's peak.
func TestThresholdsCommand(t *testing.T) {
	recorded := t.TempDir()
	current := replayConfig(t, recorded, 100, 1000, freeAddr(t))
	sendTraffic(t, current, "token")
	db := filepath.Join(recorded, "bw.db")
	before := fileSum(t, db)
	var out bytes.Buffer
	args := []string{"thresholds", "--config", current, "--days", "1", "--to", replayDay.Format("2006-01-02"), "--json"}
	if err := run(context.Background(), args, envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if fileSum(t, db) != before {
		t.Error("thresholds changed the database file")
	}
	var rep struct {
		Layers []struct {
			Layer     string `json:"layer"`
			Unflagged struct {
				Keys int   `json:"keys"`
				Max  int64 `json:"max"`
			} `json:"unflagged"`
			Suggested int64 `json:"suggested"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json does not parse: %v\n%s", err, out.String())
	}
	byLayer := map[string]int64{}
	for _, l := range rep.Layers {
		byLayer[l.Layer] = l.Suggested
		if l.Layer == "rate" || l.Layer == "daily" {
			if l.Unflagged.Keys != 3 || l.Suggested <= l.Unflagged.Max {
				t.Errorf("%s: %+v, want 3 users and a line above their peak", l.Layer, l)
			}
		}
	}
	// carol sent 44 of the 90 requests, all on that day.
	if got := byLayer["daily"]; got != 66 {
		t.Errorf("suggested daily line %d, want 66 (44 and half as much again)", got)
	}
	out.Reset()
	if err := run(context.Background(), args[:len(args)-1], envFrom(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "requests per user in any 1m0s") {
		t.Errorf("the table lacks the rate measure:\n%s", out.String())
	}
}

// routeReplayConfig is replayConfig with two guarded routes proxied to
// upstream: "checkout" per user at rate per minute and a daily line, and
// "contact" per client IP at contactRate per minute.
func routeReplayConfig(t *testing.T, dir, upstream string, rate, daily, contactRate int) string {
	t.Helper()
	path := replayConfig(t, dir, 100, 1000, freeAddr(t))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, `
[[routes]]
name = "checkout"
methods = ["POST"]
path = "/api/checkout"
upstream = %q
identity = "user"
rate = %d
window = "1m"
burst = 0
daily = %d

[[routes]]
name = "contact"
methods = ["POST"]
path = "/contact"
upstream = %q
identity = "ip"
rate = %d
window = "1m"
burst = 0
`, upstream, rate, daily, upstream, contactRate)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// sendRouteTraffic starts the service of the config at path on a clock it
// steps and sends the same requests to the guarded routes (three users on
// checkout, one every 5 seconds, the third twice as often; every fourth
// step also a contact form), and returns the refusals it answered,
// "route:NAME key" -> count.
func sendRouteTraffic(t *testing.T, path string) refusalsByKey {
	t.Helper()
	a, keys, clock := openStepped(t, path, envFrom(nil))
	defer a.Close()
	post := func(p, key string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+a.Addr()+p, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	got := refusalsByKey{}
	note := func(i int, layer, key string, status int, body string) {
		switch {
		case status == http.StatusOK:
		case status == http.StatusTooManyRequests && strings.Contains(body, "rate_limited"):
			got[layer+" "+key]++
			got["why rate"]++
		case status == http.StatusTooManyRequests && strings.Contains(body, "daily_limit"):
			got[layer+" "+key]++
			got["why daily"]++
		default:
			t.Fatalf("request %d to %s: %d %s", i, layer, status, body)
		}
	}
	at := replayDay
	for i := range 80 {
		at = at.Add(5 * time.Second)
		clock.Store(at.UnixNano())
		user := []string{"alice", "bob", "carol", "carol"}[i%4]
		status, body := post("/api/checkout", keys[user])
		note(i, "route:checkout", user, status, body)
		if i%4 == 0 {
			status, body := post("/contact", "")
			note(i, "route:contact", "ip:127.0.0.1", status, body)
		}
	}
	return got
}

// A replay of route traffic recorded under loose limits through a
// candidate with tight route limits reports, per route, exactly the
// refusals that enforcing the candidate answers to the same requests.
func TestReplayRoutesMatchAnEnforcingRun(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	defer up.Close()
	recorded := t.TempDir()
	current := routeReplayConfig(t, recorded, up.URL, 1000, 0, 1000)
	tight := routeReplayConfig(t, t.TempDir(), up.URL, 4, 15, 2)

	if got := sendRouteTraffic(t, current); len(got) != 0 {
		t.Fatalf("the loose run refused %v", got)
	}
	enforced := sendRouteTraffic(t, tight)
	if enforced["why rate"] == 0 || enforced["why daily"] == 0 || enforced["route:contact ip:127.0.0.1"] == 0 {
		t.Fatalf("enforced refusals %v: want some at a route's rate, some at its daily line, some on the IP route", enforced)
	}
	delete(enforced, "why rate")
	delete(enforced, "why daily")

	// The enforcing run's own database holds its refused requests too:
	// a replay of it sees every request that reached a route.
	own, _ := runReplay(t, tight, tight, nil)
	for _, l := range own.Layers {
		want := map[string]int64{"route:checkout": 80, "route:contact": 20}[l.Layer]
		if l.Current.Requests != want {
			t.Errorf("replay of the enforcing run's database: %s saw %d requests, want %d (refused ones included)", l.Layer, l.Current.Requests, want)
		}
	}

	rep, text := runReplay(t, current, tight, nil)
	t.Logf("replay:\n%s", text)
	if got := candidateRefusals(rep); fmt.Sprint(got) != fmt.Sprint(enforced) {
		t.Errorf("replay of the tight candidate refuses %v, the enforcing run %v", got, enforced)
	}
	seen := map[string]int64{}
	for _, l := range rep.Layers {
		seen[l.Layer] = l.Candidate.Requests
		if l.Current.Refused != 0 {
			t.Errorf("layer %s: the current config refuses %d on replay, want 0", l.Layer, l.Current.Refused)
		}
	}
	if seen["route:checkout"] != 80 || seen["route:contact"] != 20 {
		t.Errorf("requests seen per layer %v, want 80 on checkout and 20 on contact", seen)
	}
	if !strings.Contains(text, "route:checkout: the candidate would have refused") || !strings.Contains(text, "invites fail limit: not replayed") {
		t.Errorf("the text report lacks the route's differences or the note on the fail limit:\n%s", text)
	}
}

// openStepped makes keys for alice, bob and carol, then opens the service
// of the config at path on a clock that starts at replayDay and that the
// caller steps; the caller closes it.
func openStepped(t *testing.T, path string, env func(string) string) (*app.App, map[string]string, *atomic.Int64) {
	t.Helper()
	keys := map[string]string{}
	for _, u := range []string{"alice", "bob", "carol"} {
		keys[u] = createKey(t, path, u)
	}
	cfg, err := app.Load(path, envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	clock := new(atomic.Int64)
	clock.Store(replayDay.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	a, err := app.Open(context.Background(), cfg, app.Options{Getenv: env, Now: now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return a, keys, clock
}
