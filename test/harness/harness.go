// Package harness runs the real breakwater binary for the reliability
// tests under test/: it builds the binary, writes its config, creates API
// keys with its own CLI, starts and kills the server, and plays a fake
// Gemini that speaks the REST wire format and counts every call it is
// sent. Everything listens on 127.0.0.1 only (or on an address of a
// network namespace the test made, NewGeminiAt), and every wait is bounded.
//
// It refuses to do what a test must see for itself: it checks no
// invariant and hides no failure; a server that does not come up is an
// error with its log attached.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Errors of the harness.
var (
	// ErrNoModule means the module root could not be found.
	ErrNoModule = errors.New("harness: no go.mod found")
	// ErrNotListening means the server did not log its address in time.
	ErrNotListening = errors.New("harness: the server did not start listening")
)

// ModuleRoot is the folder of the go.mod that `go env GOMOD` names, from
// the current directory.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", ErrNoModule
	}
	return filepath.Dir(mod), nil
}

// Build compiles the breakwater binary of the module at root into dir with
// the build tags given (never with -race: the binary is the thing under
// test, not the test) and returns its path.
func Build(ctx context.Context, root, dir string, tags ...string) (string, error) {
	bin := filepath.Join(dir, "breakwater")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, ".")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// Config is what WriteConfig puts in a config.toml for a test server.
// The fields after Plan are optional: their zero value keeps what the
// config has always said (bolt, no money ceiling, a quota and a daily
// line out of the way, the shipped output cap).
type Config struct {
	DBPath        string // storage.path
	GeminiURL     string // ocr.base_url
	DailyRequests int64  // budget.daily_requests; the one ceiling on unless DailyUSD is set
	Plan          string // the one plan's name; no quota or daily line to speak of unless set below

	// Backend is storage.backend: "" or "bolt", or "postgres" (its URL
	// then comes from BREAKWATER_POSTGRES_URL in the server's environment,
	// with BREAKWATER_SECRET: pass them to Start, NewKey and Command).
	Backend         string
	DailyUSD        float64 // budget.daily_usd; 0: off
	MonthlyUSD      float64 // budget.monthly_usd; 0: off
	MonthlyQuota    int64   // the plan's monthly_quota; 0: 100,000,000
	DailyAttempts   int64   // the plan's daily_attempts; 0: off
	MaxOutputTokens int     // ocr.price.max_output_tokens; 0: the default
}

// WriteConfig writes a config for a test server to path: loopback only,
// the real Gemini client pointed at cfg.GeminiURL, limits out of the way
// except the global daily_requests ceiling (and those cfg sets), the
// admin API off unless BREAKWATER_ADMIN_TOKEN is in the server's
// environment.
func WriteConfig(path string, cfg Config) error {
	backend := cfg.Backend
	if backend == "" {
		backend = "bolt"
	}
	quota := cfg.MonthlyQuota
	if quota == 0 {
		quota = 100000000
	}
	price := ""
	if cfg.MaxOutputTokens > 0 {
		price = fmt.Sprintf("\n[ocr.price]\nmax_output_tokens = %d\n", cfg.MaxOutputTokens)
	}
	body := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_in_flight_per_user = 64

[storage]
backend = %q
path = %q

[ocr]
provider = "gemini"
model = "gemini-3.5-flash-lite"
base_url = %q
timeout = "10s"
# Every read is a paid one: the tests check each 200 against its usage row.
dedupe_window = "0s"
%s
[limits.user]
rate = 100000
window = "1m"
burst = 100000

[budget]
timezone = "UTC"
daily_requests = %d
daily_usd = %g
monthly_usd = %g

[plans.%s]
monthly_quota = %d
daily_attempts = %d
`, backend, cfg.DBPath, cfg.GeminiURL, price, cfg.DailyRequests, cfg.DailyUSD, cfg.MonthlyUSD, cfg.Plan, quota, cfg.DailyAttempts)
	return os.WriteFile(path, []byte(body), 0o600)
}

// CreateKey creates an API key for user on plan with the binary's own CLI
// (the server must be stopped) and returns it.
func CreateKey(ctx context.Context, bin, config, user, plan string) (string, error) {
	k, err := NewKey(ctx, bin, config, user, plan)
	return k.Secret, err
}

// Key is an API key the CLI created.
type Key struct {
	ID     string // what keys revoke takes
	Secret string // what a client sends
}

var createdRE = regexp.MustCompile(`created key (\S+) for user`)

// NewKey creates an API key for user on plan with the binary's own CLI,
// env added to the command's environment (on bolt the server must be
// stopped; on postgres the command works beside running servers).
func NewKey(ctx context.Context, bin, config, user, plan string, env ...string) (Key, error) {
	cmd := exec.CommandContext(ctx, bin, "keys", "create", "--user", user, "--plan", plan, "--config", config)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Key{}, fmt.Errorf("keys create %s: %w\n%s", user, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	k := Key{Secret: strings.TrimSpace(lines[len(lines)-1])}
	if m := createdRE.FindSubmatch(out); m != nil {
		k.ID = string(m[1])
	}
	if !strings.HasPrefix(k.Secret, "bw_") || k.ID == "" {
		return Key{}, fmt.Errorf("keys create %s: no key in %q", user, out)
	}
	return k, nil
}

// Command runs the binary's command args with --config config, env added
// to its environment, and returns what it printed (stdout and stderr).
func Command(ctx context.Context, bin, config string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, append(args, "--config", config)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Process is a running breakwater server.
type Process struct {
	Addr    string // the public listener, host:port
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	state   *os.ProcessState
}

var (
	listenRE      = regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)
	adminListenRE = regexp.MustCompile(`msg=listening listener=admin addr=(\S+)`)
	// startRE is the line the server logs before it opens any listener;
	// its admin_listen says "off (...)" when the admin API is off.
	startRE = regexp.MustCompile(`msg="starting breakwater" .*admin_listen=("?off)?`)
)

// AdminAddr is the admin listener's address, "" if it is off (no
// BREAKWATER_ADMIN_TOKEN in the environment).
func (p *Process) AdminAddr() string {
	if m := adminListenRE.FindSubmatch(readHead(p.LogPath)); m != nil {
		return string(m[1])
	}
	return ""
}

// Start runs `bin serve --config config` with env added to the process's
// environment, its log in logPath, and waits (at most 20 s) until it
// listens on every listener it opens: the public one, and the admin one
// unless the server said at its start that the admin API is off. The
// admin listener comes up a moment after the public one, so a test that
// took the public line alone could find no admin address yet.
func Start(bin, config, logPath string, env ...string) (*Process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--config", config)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	p := &Process{LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // a killed server is the point, not an error
		p.state = cmd.ProcessState
		logFile.Close()
		close(p.done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if addr, ok := listening(readHead(logPath)); ok {
			p.Addr = addr
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%w: it exited (%v); log:\n%s", ErrNotListening, p.state, Tail(logPath))
		case <-time.After(10 * time.Millisecond):
		}
	}
	p.Kill()
	return nil, fmt.Errorf("%w within 20s; log:\n%s", ErrNotListening, Tail(logPath))
}

// listening returns the public address from the head of a server's log
// once every listener the server opens is listening.
func listening(head []byte) (string, bool) {
	start := startRE.FindSubmatch(head)
	public := listenRE.FindSubmatch(head)
	if start == nil || public == nil {
		return "", false
	}
	adminOff := len(start[1]) > 0
	if !adminOff && !adminListenRE.Match(head) {
		return "", false
	}
	return string(public[1]), true
}

// PID is the server's process id, for reading its /proc entries.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL and waits (at most 10 s) for the process to be gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Stop sends SIGTERM, the graceful shutdown, and waits at most timeout
// before it kills.
func (p *Process) Stop(timeout time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
	}
}

// Killed reports whether the process ended by SIGKILL; call it after Done.
func (p *Process) Killed() bool {
	if p.state == nil {
		return false
	}
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// readHead returns the first 64 KiB of a log, where the listen line is.
func readHead(path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	n, _ := f.Read(buf)
	return buf[:n]
}

// Tail returns the last 40 lines of a log, for error messages.
func Tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 40 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// PNG returns a small valid PNG image.
func PNG() []byte { return NthPNG(0) }

// NthPNG returns a small valid PNG image, a different one for each n (the
// bits of n are drawn in its last row), for tests where a repeated image
// would be answered from the same-image window.
//
// It is cheap under -race, where a burst of 200 clients each encoding
// its image spent seconds of the test's CPU and starved the fake Gemini
// in the same process (an upstream timeout, a 502): the stripes are drawn
// once, the image is stored uncompressed, and the encoder's buffers (a
// zlib writer is some 800 KiB, about 25 ms of -race's bookkeeping to
// allocate) are reused.
func NthPNG(n uint64) []byte {
	img := image.NewGray(image.Rect(0, 0, 64, 24))
	copy(img.Pix, stripes())
	for x := range 64 {
		if n>>uint(x)&1 == 1 {
			img.SetGray(x, 23, color.Gray{Y: 0})
		}
	}
	var b bytes.Buffer
	_ = pngEncoder.Encode(&b, img) // cannot fail on a bytes.Buffer
	return b.Bytes()
}

// stripes is the pixels NthPNG draws its bits on: black bars on white.
var stripes = sync.OnceValue(func() []byte {
	img := image.NewGray(image.Rect(0, 0, 64, 24))
	for y := range 24 {
		for x := range 64 {
			if (x/4)%2 == 0 && y > 6 && y < 18 {
				img.SetGray(x, y, color.Gray{Y: 0})
			} else {
				img.SetGray(x, y, color.Gray{Y: 255})
			}
		}
	}
	return img.Pix
})

// pngEncoder encodes NthPNG's images, uncompressed, with reused buffers.
var pngEncoder = png.Encoder{CompressionLevel: png.NoCompression, BufferPool: &pngBuffers{}}

// pngBuffers is a png.EncoderBufferPool safe for concurrent use, of at
// most 16 buffers. It is no sync.Pool, which under -race drops what it is
// given at random.
type pngBuffers struct {
	mu   sync.Mutex
	free []*png.EncoderBuffer
}

func (p *pngBuffers) Get() *png.EncoderBuffer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return nil // the encoder makes a new one
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return b
}

func (p *pngBuffers) Put(b *png.EncoderBuffer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < 16 { // a burst's encoders are few at a time: no more are kept
		p.free = append(p.free, b)
	}
}

// BuildForMain is the start of a TestMain that runs the real binary: it
// builds breakwater into a temporary folder (of name's), and moves into
// the module's root, from which the fake Gemini reads ocr/testdata. It
// returns the binary's path and what removes the folder.
func BuildForMain(name string) (bin string, cleanup func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "breakwater-"+name+"-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	if bin, err = Build(ctx, root, dir); err == nil {
		err = os.Chdir(root)
	}
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return bin, cleanup, nil
}

// StopAll stops every process of procs at once (nil ones skipped), each
// within timeout: a clean stop gives back the leases and quota holds.
func StopAll(timeout time.Duration, procs ...*Process) {
	var wg sync.WaitGroup
	for _, p := range procs {
		if p != nil {
			wg.Go(func() { p.Stop(timeout) })
		}
	}
	wg.Wait()
}

// Logs is the tail of each process's log (nil ones skipped), each under
// its name, for a failure message.
func Logs(name func(i int) string, procs ...*Process) string {
	var b strings.Builder
	for i, p := range procs {
		if p != nil {
			fmt.Fprintf(&b, "--- %s:\n%s\n", name(i), Tail(p.LogPath))
		}
	}
	return b.String()
}
