// Command flood is the hostile side of the tests in test/hostile: it
// sends one kind of traffic at a breakwater server on 127.0.0.1 until its
// -duration is up or it gets SIGTERM, then prints what it saw as one JSON
// object. The tests build it without -race and run it as a process of
// its own, so that the legitimate client they time shares neither the
// race detector's cost nor a scheduler with the flood.
//
// Modes:
//
//	slowloris  -conns N: each connection sends an endless header block a
//	           byte every -interval, and reconnects when it is cut off
//	headers    -conns N: each connection sends -header-bytes of header
//	           lines with values of -value bytes (each name its own) and
//	           never ends the block; when cut off it waits about -pause
//	           and reconnects
//	idle       -conns N: each connection makes one request, holds the
//	           connection open until the server closes it, waits about
//	           -pause and reconnects
//	badkeys    -workers N: POST /v1/ocr with made-up API keys, each from
//	           its own X-Forwarded-For address
//	onekey     -workers N: POST /v1/ocr with -key as fast as it can
//	users      -from A -to B: for each i, an API key for user-i through
//	           the admin API (-admin, BREAKWATER_ADMIN_TOKEN), then one read
//	ips        -from A -to B: for each i, a wrong invite code from the
//	           i-th address with the i-th e-mail
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Summary is what flood prints when it stops.
type Summary struct {
	Dials    int64          `json:"dials"`    // connections opened
	Cut      int64          `json:"cut"`      // connections the server closed
	Requests int64          `json:"requests"` // requests answered
	Status   map[int]int64  `json:"status"`   // answers by status
	NoRetry  int64          `json:"no_retry"` // 429s without a Retry-After
	Errors   []string       `json:"errors"`   // the first transport errors or unexpected answers
	Extra    map[string]int `json:"extra,omitempty"`
}

type flooder struct {
	addr, admin, key, token string
	conns, workers          int
	from, to                int
	interval, pause         time.Duration
	headerBytes, value      int
	img                     []byte

	dials, cut, requests, noRetry atomic.Int64
	mu                            sync.Mutex
	status                        map[int]int64
	errs                          []string
}

func main() {
	var f flooder
	mode := flag.String("mode", "", "slowloris, headers, idle, badkeys, onekey, users or ips")
	flag.StringVar(&f.addr, "addr", "", "the public listener, 127.0.0.1:PORT")
	flag.StringVar(&f.admin, "admin", "", "the admin listener (users)")
	flag.StringVar(&f.key, "key", "", "the API key (onekey)")
	flag.IntVar(&f.conns, "conns", 500, "connections (slowloris, idle)")
	flag.IntVar(&f.workers, "workers", 16, "concurrent clients (badkeys, onekey, users, ips)")
	flag.IntVar(&f.from, "from", 0, "first index (users, ips)")
	flag.IntVar(&f.to, "to", 0, "index after the last (users, ips)")
	flag.DurationVar(&f.interval, "interval", 200*time.Millisecond, "between header bytes (slowloris)")
	flag.DurationVar(&f.pause, "pause", time.Second, "before reconnecting (idle, headers)")
	flag.IntVar(&f.headerBytes, "header-bytes", 32000, "bytes of the header block each connection sends (headers)")
	flag.IntVar(&f.value, "value", 1, "bytes of each header value (headers)")
	duration := flag.Duration("duration", 10*time.Second, "longest run")
	flag.Parse()
	if !strings.HasPrefix(f.addr, "127.0.0.1:") {
		fmt.Fprintln(os.Stderr, "flood: -addr must be 127.0.0.1:PORT")
		os.Exit(2)
	}
	f.token = os.Getenv("BREAKWATER_ADMIN_TOKEN")
	f.status = map[int]int64{}
	f.img = tinyPNG()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()

	run := map[string]func(context.Context){
		"slowloris": f.slowloris, "headers": f.headers, "idle": f.idle, "badkeys": f.badKeys,
		"onekey": f.oneKey, "users": f.users, "ips": f.ips,
	}[*mode]
	if run == nil {
		fmt.Fprintf(os.Stderr, "flood: unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	run(ctx)
	s := Summary{Dials: f.dials.Load(), Cut: f.cut.Load(), Requests: f.requests.Load(), Status: f.status, NoRetry: f.noRetry.Load(), Errors: f.errs}
	if err := json.NewEncoder(os.Stdout).Encode(s); err != nil {
		os.Exit(1)
	}
}

// each runs fn(i) for i in [0, n) on its own goroutine, the starts spread
// over the first second, and waits for them.
func each(ctx context.Context, n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			select {
			case <-time.After(time.Duration(i) * time.Second / time.Duration(n)):
			case <-ctx.Done():
				return
			}
			fn(i)
		})
	}
	wg.Wait()
}

func (f *flooder) errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) < 10 {
		f.errs = append(f.errs, fmt.Sprintf(format, args...))
	}
}

func (f *flooder) answered(status int, retryAfter string) {
	f.requests.Add(1)
	if status == http.StatusTooManyRequests && (retryAfter == "" || retryAfter == "0") {
		f.noRetry.Add(1)
	}
	f.mu.Lock()
	f.status[status]++
	f.mu.Unlock()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

func (f *flooder) dial(ctx context.Context) (net.Conn, bool) {
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", f.addr)
	if err != nil {
		// The backlog was full, or the run is over: try again shortly.
		sleep(ctx, 50*time.Millisecond)
		return nil, false
	}
	f.dials.Add(1)
	return conn, true
}

func (f *flooder) slowloris(ctx context.Context) {
	each(ctx, f.conns, func(int) {
		for ctx.Err() == nil {
			conn, ok := f.dial(ctx)
			if !ok {
				continue
			}
			if f.slowHeaders(ctx, conn) {
				f.cut.Add(1)
			}
			conn.Close()
		}
	})
}

// slowHeaders sends an endless header block a byte every interval until
// the server cuts the connection off (true) or ctx ends.
func (f *flooder) slowHeaders(ctx context.Context, conn net.Conn) bool {
	msg := "POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
	pad := "X-Pad: " + strings.Repeat("a", 64) + "\r\n"
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for i := 0; ; i++ {
		if i == len(msg) {
			msg, i = pad, 0
		}
		if _, err := conn.Write([]byte{msg[i]}); err != nil {
			return closed(err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

func (f *flooder) headers(ctx context.Context) {
	block := headerBlock(f.headerBytes, f.value)
	each(ctx, f.conns, func(int) {
		for ctx.Err() == nil {
			conn, ok := f.dial(ctx)
			if !ok {
				continue
			}
			if f.holdHeaders(ctx, conn, block) {
				f.cut.Add(1)
			}
			conn.Close()
			sleep(ctx, f.pause/2+rand.N(f.pause+1))
		}
	})
}

// headerBlock is a request line and header lines of n bytes in all, each
// line with a name of its own and a value of value bytes, without the
// empty line that would end the block.
func headerBlock(n, value int) []byte {
	b := []byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")
	v := strings.Repeat("v", value)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%x: %s\r\n", i, v)
	}
	return b[:n]
}

// holdHeaders sends block on conn and then holds the connection open
// until the server closes it (true) or ctx ends.
func (f *flooder) holdHeaders(ctx context.Context, conn net.Conn, block []byte) bool {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write(block); err != nil {
		return ctx.Err() == nil && closed(err)
	}
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			return ctx.Err() == nil && closed(err)
		}
	}
}

func (f *flooder) idle(ctx context.Context) {
	each(ctx, f.conns, func(int) {
		for ctx.Err() == nil {
			conn, ok := f.dial(ctx)
			if !ok {
				continue
			}
			if f.holdIdle(ctx, conn) {
				f.cut.Add(1)
			}
			conn.Close()
			// 0.5 to 1.5 times pause, so that connections closed
			// together do not all come back together.
			sleep(ctx, f.pause/2+rand.N(f.pause+1))
		}
	})
}

// holdIdle makes one request on conn and then holds it open until the
// server closes it (true) or ctx ends.
func (f *flooder) holdIdle(ctx context.Context, conn net.Conn) bool {
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		return closed(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			return ctx.Err() == nil && closed(err)
		}
	}
}

func closed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
}

func (f *flooder) post(ctx context.Context, c *http.Client, path, key, ip, ctype string, body []byte) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.addr+path, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("X-Forwarded-For", ip)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header.Get("Retry-After"), err
}

// workersUntil runs fn on f.workers goroutines until ctx ends.
func (f *flooder) workersUntil(ctx context.Context, fn func(w, i int, c *http.Client)) {
	each(ctx, f.workers, func(w int) {
		c := client()
		for i := 0; ctx.Err() == nil; i++ {
			fn(w, i, c)
		}
	})
}

func (f *flooder) badKeys(ctx context.Context) {
	f.workersUntil(ctx, func(w, i int, c *http.Client) {
		r := rand.New(rand.NewPCG(uint64(w), uint64(i)))
		status, ra, err := f.post(ctx, c, "/v1/ocr", randomKey(r), ipOf(w<<16|i&0xffff), "image/png", f.img)
		f.outcome(ctx, status, ra, err, http.StatusUnauthorized)
	})
}

func (f *flooder) oneKey(ctx context.Context) {
	f.workersUntil(ctx, func(w, i int, c *http.Client) {
		status, ra, err := f.post(ctx, c, "/v1/ocr", f.key, "203.0.113.66", "image/png", f.img)
		f.outcome(ctx, status, ra, err, http.StatusOK, http.StatusTooManyRequests)
	})
}

// outcome counts an answer; one that is not among want is also noted.
func (f *flooder) outcome(ctx context.Context, status int, retryAfter string, err error, want ...int) {
	if ctx.Err() != nil {
		return // cut off by the end of the run
	}
	if err != nil {
		f.errorf("%v", err)
		return
	}
	f.answered(status, retryAfter)
	for _, w := range want {
		if status == w {
			return
		}
	}
	f.errorf("status %d", status)
}

// indexed runs fn for every index in [from, to) on f.workers goroutines.
func (f *flooder) indexed(ctx context.Context, fn func(i int, c *http.Client)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range f.workers {
		wg.Go(func() {
			c := client()
			for i := range next {
				fn(i, c)
			}
		})
	}
	for i := f.from; i < f.to && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

func (f *flooder) users(ctx context.Context) {
	admin := client()
	f.indexed(ctx, func(i int, c *http.Client) {
		key, err := f.createKey(ctx, admin, fmt.Sprintf("user-%07d", i))
		if err != nil {
			f.errorf("key of user %d: %v", i, err)
			return
		}
		status, ra, err := f.post(ctx, c, "/v1/ocr", key, "198.51.100.20", "image/png", f.img)
		f.outcome(ctx, status, ra, err, http.StatusOK)
	})
}

func (f *flooder) createKey(ctx context.Context, c *http.Client, user string) (string, error) {
	body, _ := json.Marshal(map[string]string{"user": user, "plan": "load"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.admin+"/api/keys", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var out struct {
		Key string `json:"key"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &out) != nil || out.Key == "" {
		return "", fmt.Errorf("POST /api/keys: %d %s", resp.StatusCode, b)
	}
	return out.Key, nil
}

func (f *flooder) ips(ctx context.Context) {
	f.indexed(ctx, func(i int, c *http.Client) {
		body := fmt.Sprintf(`{"code":"WRONG-CODE-%07d","email":"guess%d@example.com"}`, i, i)
		status, ra, err := f.post(ctx, c, "/v1/invites/verify", "", ipOf(i), "application/json", []byte(body))
		f.outcome(ctx, status, ra, err, http.StatusForbidden)
	})
}

// randomKey is an API key of the right shape that no one holds.
func randomKey(r *rand.Rand) string {
	const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := []byte("bw_")
	for range 32 {
		b = append(b, base62[r.IntN(len(base62))])
	}
	return string(b)
}

// ipOf is the n-th distinct client address, from 10.0.0.1 on.
func ipOf(n int) string {
	n++
	return fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
}

// tinyPNG is a small valid PNG.
func tinyPNG() []byte {
	img := image.NewGray(image.Rect(0, 0, 64, 24))
	for i := range img.Pix {
		img.Pix[i] = byte(255 * (i / 4 % 2))
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img) // cannot fail on a bytes.Buffer
	return b.Bytes()
}
