package main

// The servers the harness starts, each its own process on loopback: the
// real breakwater binary (built from this module), a bare Echo handler, and
// the Redis-backed peer (an Echo handler making three redis_rate decisions
// per request) with the redis-server it talks to. The bare Echo handler and
// the peer are this program run again as a child (see childMain), so every
// server is a process of its own, as wrk would see it.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"breakwater/server/keys"
	"breakwater/storage"
)

// process is a child process the harness started and must stop.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	waitErr error
}

// startProcess starts bin with args and env, its output going to logPath.
func startProcess(name, logPath string, env []string, bin string, args ...string) (*process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// If the harness dies, its servers die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to end (SIGTERM) and kills it if it has not ended
// within 20 s.
func (p *process) stop() {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// logTail returns the last lines of the process's output, for errors.
func (p *process) logTail() string {
	data, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// rss returns the resident set size of process pid in bytes (VmRSS).
func rss(pid int) (int64, error) {
	m, err := memOf(pid)
	return m.rss, err
}

// memSample is a process's resident memory: all of it (VmRSS) and its
// anonymous part (RssAnon: the heap and stacks, without mapped files such
// as the database).
type memSample struct{ rss, anon int64 }

// memOf reads pid's memSample from /proc/PID/status.
func memOf(pid int) (memSample, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memSample{}, err
	}
	var m memSample
	found := 0
	for line := range strings.Lines(string(data)) {
		field, dst := "", (*int64)(nil)
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			field, dst = "VmRSS:", &m.rss
		case strings.HasPrefix(line, "RssAnon:"):
			field, dst = "RssAnon:", &m.anon
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(line[len(field):]), " kB"), 10, 64)
		if err != nil {
			return memSample{}, fmt.Errorf("/proc/%d/status: %s %w", pid, field, err)
		}
		*dst = kb << 10
		found++
	}
	if found != 2 {
		return memSample{}, fmt.Errorf("no VmRSS and RssAnon in /proc/%d/status", pid)
	}
	return m, nil
}

// cpuTime returns the CPU time (user + system) process pid has used.
func cpuTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// after its closing parenthesis; utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ, 100 on every Linux architecture Go runs on
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls http://addr+path (with the bearer token, if any) until it
// answers 200, p ends, or 30 s pass.
func waitHTTP(p *process, addr, path, token string) error {
	deadline := time.Now().Add(30 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited at start: %v\n%s", p.name, p.waitErr, p.logTail())
		}
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer %s within 30 s\n%s", p.name, path, p.logTail())
}

// childEnv filters the harness's environment for a server: no
// BREAKWATER_* override or Gemini key from the developer's shell may change
// the configuration the harness wrote.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "BREAKWATER_") || strings.HasPrefix(kv, "GEMINI_") || strings.HasPrefix(kv, "GOOGLE_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// moduleRoot returns the directory of the breakwater module (the go.mod
// that the current directory belongs to).
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the breakwater module: run from the repository, or pass -root")
	}
	return filepath.Dir(gomod), nil
}

// prebuilt, when set, is the binary buildBreakwater returns instead of
// building one: the tests build it once for both smoke tests (TestMain).
var prebuilt string

// buildBreakwater builds the binary from the module at root into dir (or
// returns prebuilt).
func buildBreakwater(root, dir string) (string, error) {
	if prebuilt != "" {
		return prebuilt, nil
	}
	bin := filepath.Join(dir, "breakwater")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// bwConfig is what differs between the breakwater instances.
type bwConfig struct {
	ceilings        bool          // budget ceilings very high (true) or off with explicit 0s
	rate, burst     int           // [limits.user]
	window          string        // [limits.user] window
	latency         time.Duration // the simulated upstream's latency
	inFlightPerUser int           // server.max_in_flight_per_user
	maxConnections  int           // server.max_connections
	trustLoopback   bool          // trust X-Forwarded-For from 127.0.0.1
	pprof           bool          // server.admin_pprof (-profile)
	// postgresURL, when set, puts the instance on PostgreSQL (storage
	// backend "postgres", the URL in its environment) instead of its own
	// BoltDB file.
	postgresURL string
}

// breakwater is one instance of the real binary with its own config and
// throwaway database.
type breakwater struct {
	name, bin, dir, config string
	addr, admin, token     string
	postgresURL            string // "" on bolt
	proc                   *process
	starts                 int
}

// newBreakwater writes the config of an instance under dir; it is not
// started yet.
func newBreakwater(name, bin, dir string, c bwConfig) (*breakwater, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := freePort()
	if err != nil {
		return nil, err
	}
	token := make([]byte, 24)
	_, _ = rand.Read(token)
	b := &breakwater{
		name: name, bin: bin, dir: dir, config: filepath.Join(dir, "config.toml"),
		addr:        fmt.Sprintf("127.0.0.1:%d", port),
		admin:       fmt.Sprintf("127.0.0.1:%d", adminPort),
		token:       hex.EncodeToString(token),
		postgresURL: c.postgresURL,
	}
	store := fmt.Sprintf("path = %q", filepath.Join(dir, "data", "breakwater.db"))
	if c.postgresURL != "" {
		store = `backend = "postgres" # its URL is in the environment`
	}
	budget := "daily_requests = 1000000000\ndaily_usd = 1000000000.0\nmonthly_usd = 1000000000.0"
	if !c.ceilings {
		budget = "daily_requests = 0\ndaily_usd = 0\nmonthly_usd = 0"
	}
	trusted := "[]"
	if c.trustLoopback {
		trusted = `["127.0.0.1"]`
	}
	profiler := ""
	if c.pprof {
		profiler = "admin_pprof = true # -profile: CPU profiles over the admin listener\n"
	}
	cfg := fmt.Sprintf(`# Written by bench/load for one benchmark run.
[server]
listen = %q
admin_listen = %q
trusted_proxies = %s
max_in_flight_per_user = %d
max_connections = %d
%s
[storage]
%s

[ocr]
provider = "simulated"
simulated_latency = %q
dedupe_window = "0s" # the same image each time: measure reads, not cached answers

[limits.user]
rate = %d
window = %q
burst = %d

[invites]
# Far above the flood of wrong guesses the memory figure sends.
global_fail_per_hour = 1000000000

[budget]
%s

[plans.free]
monthly_quota = 1000000000
daily_attempts = 1000000000
`, b.addr, b.admin, trusted, c.inFlightPerUser, c.maxConnections, profiler,
		store, c.latency.String(),
		c.rate, c.window, c.burst, budget)
	return b, os.WriteFile(b.config, []byte(cfg), 0o644)
}

func (b *breakwater) env() []string {
	return append(b.storageEnv(), "BREAKWATER_ADMIN_TOKEN="+b.token)
}

// benchSecret is BREAKWATER_SECRET of the instances on PostgreSQL: every
// instance on one database needs the same.
const benchSecret = "bench-load-secret-0123456789abcdef"

// storageEnv is the environment the instance and its commands need to
// reach their storage: on PostgreSQL its URL and the shared secret.
func (b *breakwater) storageEnv() []string {
	if b.postgresURL == "" {
		return childEnv()
	}
	return childEnv("BREAKWATER_POSTGRES_URL="+b.postgresURL, "BREAKWATER_SECRET="+benchSecret)
}

// createKeyStopped runs `breakwater keys create --user USER` on the stopped
// instance and returns the key (the last line of its output).
func (b *breakwater) createKeyStopped(user string) (string, error) {
	cmd := exec.Command(b.bin, "keys", "create", "--user", user, "--config", b.config)
	cmd.Env = b.storageEnv() // no admin token: the command opens the database itself
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("%s: keys create: %w\n%s", b.name, err, ee.Stderr)
		}
		return "", fmt.Errorf("%s: keys create: %w", b.name, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	key := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(key, "bw_") {
		return "", fmt.Errorf("%s: keys create printed %q, not a key, on its last line", b.name, key)
	}
	return key, nil
}

// start runs `breakwater serve` and waits until /healthz answers.
func (b *breakwater) start() error {
	b.starts++
	p, err := startProcess(b.name, filepath.Join(b.dir, fmt.Sprintf("serve-%d.log", b.starts)), b.env(),
		b.bin, "serve", "--config", b.config)
	if err != nil {
		return err
	}
	b.proc = p
	if err := waitHTTP(p, b.addr, "/healthz", ""); err != nil {
		p.stop()
		return err
	}
	if err := waitHTTP(p, b.admin, "/healthz", b.token); err != nil {
		p.stop()
		return err
	}
	return nil
}

func (b *breakwater) stop() { b.proc.stop() }

// createKeys makes one key per user through the admin API (POST /api/keys)
// while the instance runs, several at a time, and returns them in order.
func (b *breakwater) createKeys(users []string) ([]string, error) {
	const workers = 16
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	keys := make([]string, len(users))
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				key, err := b.createKey(client, users[i])
				if err != nil {
					errs <- err
					for range next { // drain: the others stop too
					}
					return
				}
				keys[i] = key
			}
		}()
	}
	for i := range users {
		next <- i
		if len(errs) > 0 {
			break
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return keys, nil
}

// seedKeys writes one key per user straight into the stopped instance's
// database, without fsync, and returns the keys in order. It is for the
// memory figures' 100,000 keys: through the admin API each new user costs
// a scan of every user already there, so 100,000 would take most of an
// hour. The keys are shaped as breakwater makes them ("bw_" and 32 base62
// characters, only their SHA-256 stored).
func (b *breakwater) seedKeys(users []string) ([]string, error) {
	db, err := storage.Open(filepath.Join(b.dir, "data", "breakwater.db"),
		storage.Options{NoSync: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	secrets := make([]string, len(users))
	for i, user := range users {
		secrets[i] = "bw_" + randomBase62(32)
		k := keys.Key{ID: "key_" + randomBase62(10), Hash: sha256.Sum256([]byte(secrets[i])), UserID: user, CreatedAt: now}
		if err := db.CreateKey(k, keys.User{ID: user, Plan: "free", CreatedAt: now}); err != nil {
			db.Close()
			return nil, fmt.Errorf("%s: seed key for %s: %w", b.name, user, err)
		}
	}
	return secrets, db.Close()
}

func randomBase62(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = base62[int(b[i])%len(base62)] // a slight bias is fine for test keys
	}
	return string(b)
}

func (b *breakwater) createKey(client *http.Client, user string) (string, error) {
	body, _ := json.Marshal(map[string]string{"user": user})
	req, err := http.NewRequest(http.MethodPost, "http://"+b.admin+"/api/keys", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s: POST /api/keys: %w", b.name, err)
	}
	defer resp.Body.Close()
	var out struct {
		Key string `json:"key"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusCreated || out.Key == "" {
		return "", fmt.Errorf("%s: POST /api/keys for %s: status %d, %v", b.name, user, resp.StatusCode, err)
	}
	return out.Key, nil
}

// findRedis returns the path of redis-server, installing Debian's package
// with apt-get when it is missing and apt-get is there.
func findRedis(progress func(string, ...any)) (string, error) {
	if path, err := exec.LookPath("redis-server"); err == nil {
		return path, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", errors.New("redis-server not found and no apt-get to install it: install Redis 7 (Debian: apt-get install redis-server)")
	}
	progress("redis-server not found: installing Debian's redis-server with apt-get")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "redis-server"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("redis-server not found, and apt-get %s failed: %w\n%s", args[0], err, out)
		}
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server still not found after apt-get install redis-server")
	}
	return path, nil
}

// startRedis starts redis-server on a loopback port, keeping nothing on
// disk, and waits until it answers PING.
func startRedis(bin, dir string) (*process, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := startProcess("redis-server", filepath.Join(dir, "redis.log"), childEnv(), bin,
		"--save", "", "--appendonly", "no", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir)
	if err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p.exited() {
			return nil, "", fmt.Errorf("redis-server exited at start: %v\n%s", p.waitErr, p.logTail())
		}
		if pingRedis(addr) == nil {
			return p, addr, nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, "", fmt.Errorf("redis-server did not answer PING within 20 s\n%s", p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func pingRedis(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("redis answered %q to PING", line)
	}
	return nil
}

// The harness runs itself again as the bare Echo server or the Redis peer
// when childKindEnv is set; childListenEnv and childRedisEnv say where.
const (
	childKindEnv   = "BREAKWATER_BENCH_CHILD"
	childListenEnv = "BREAKWATER_BENCH_LISTEN"
	childRedisEnv  = "BREAKWATER_BENCH_REDIS"
)

// startChild starts this program again as a server of the given kind
// ("echo" or "peer") and waits until it answers.
func startChild(kind, dir string, extraEnv ...string) (*process, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	env := childEnv(append([]string{childKindEnv + "=" + kind, childListenEnv + "=" + addr}, extraEnv...)...)
	p, err := startProcess(kind, filepath.Join(dir, kind+".log"), env, self)
	if err != nil {
		return nil, "", err
	}
	if err := waitHTTP(p, addr, "/healthz", ""); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

// spin keeps every core busy until SIGTERM (the "spin" child: other
// processes' work, for the fsync control).
func spin() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var done atomic.Bool
	go func() { <-ctx.Done(); done.Store(true) }()
	var wg sync.WaitGroup
	for range runtime.NumCPU() {
		wg.Go(func() {
			for !done.Load() {
			}
		})
	}
	wg.Wait()
}

// childMain runs the child server named by childKindEnv until SIGTERM. It
// reports false if this process is not a child.
func childMain() (bool, error) {
	kind := os.Getenv(childKindEnv)
	if kind == "" {
		return false, nil
	}
	if kind == "spin" {
		spin()
		return true, nil
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, status{Status: "ok"}) })
	switch kind {
	case "echo":
		e.POST("/v1/ocr", func(c echo.Context) error { return c.JSON(http.StatusOK, status{Status: "ok"}) })
	case "peer":
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(childRedisEnv), PoolSize: 64})
		defer rdb.Close()
		e.POST("/v1/ocr", peerHandler(redis_rate.NewLimiter(rdb)))
	default:
		return true, fmt.Errorf("unknown child kind %q", kind)
	}
	ln, err := net.Listen("tcp", os.Getenv(childListenEnv))
	if err != nil {
		return true, err
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return true, err
	}
	return true, nil
}

// status is the small JSON the bare Echo handler answers.
type status struct {
	Status string `json:"status"`
}

// decision is the small JSON the Redis peer answers.
type decision struct {
	Allowed   bool `json:"allowed"`
	Remaining int  `json:"remaining"`
}

// peerLimit is high enough that the peer never refuses: like the accepted
// path, every decision lets the request through.
var peerLimit = redis_rate.Limit{Rate: 1_000_000_000, Burst: 1_000_000_000, Period: time.Second}

// peerHandler makes three limit decisions per request, one Redis call each,
// as envoyproxy/ratelimit does with three descriptors (user, route, client
// address), and answers a small JSON. A Redis error fails the request
// (500), as a limiter that must not be bypassed would.
func peerHandler(l *redis_rate.Limiter) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		user := c.Request().Header.Get(echo.HeaderAuthorization)
		remaining := 0
		for _, key := range [3]string{"user:" + user, "route:" + c.Path(), "addr:" + c.RealIP()} {
			res, err := l.Allow(ctx, key, peerLimit)
			if err != nil {
				return err
			}
			if res.Allowed == 0 {
				c.Response().Header().Set("Retry-After", strconv.Itoa(int(res.RetryAfter.Seconds())+1))
				return c.JSON(http.StatusTooManyRequests, decision{Allowed: false})
			}
			remaining = res.Remaining
		}
		return c.JSON(http.StatusOK, decision{Allowed: true, Remaining: remaining})
	}
}
