package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"breakwater/server/edge"
	"breakwater/server/edgetest"
)

// realServer serves e's public handler the way `serve` does: through
// Server.HTTPServer, with its timeouts, header cap and connection cap.
func realServer(t *testing.T, e *env) (addr string, lim net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs, wrapped := e.edge.HTTPServer(ln, e.srv.Handler())
	go hs.Serve(wrapped)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), wrapped
}

// upload is one raw POST /v1/ocr on its own connection, written by hand
// so that it can stop before its end.
type upload struct {
	conn net.Conn
	resp chan result
}

type result struct {
	status     int
	code       string
	retryAfter string
	closed     bool // Connection: close
	err        error
}

// startUpload sends the head of a POST /v1/ocr with key, declaring length
// (-1: chunked), then the first send bytes of body, and keeps the
// connection open without sending more (a whole chunked body is ended). The answer, once it comes, is on
// u.resp.
func startUpload(t *testing.T, addr, key string, length int64, body []byte, send int) *upload {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	u := &upload{conn: conn, resp: make(chan result, 1)}
	head := "POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nAuthorization: Bearer " + key + "\r\n"
	if length >= 0 {
		head += "Content-Length: " + strconv.FormatInt(length, 10) + "\r\n\r\n"
	} else {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	}
	go func() {
		if _, err := io.WriteString(conn, head); err != nil {
			return
		}
		if length >= 0 {
			_, _ = conn.Write(body[:send]) // a refused upload's connection closes under it
			return
		}
		for part := range pieces(body[:send], 32<<10) {
			if _, err := fmt.Fprintf(conn, "%x\r\n%s\r\n", len(part), part); err != nil {
				return
			}
		}
		if send == len(body) {
			io.WriteString(conn, "0\r\n\r\n")
		}
	}()
	go func() {
		conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound on a hang: upload_grace is 5 s by default, judged over two intervals at most
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			u.resp <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var p edge.Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		u.resp <- result{status: resp.StatusCode, code: p.Code, retryAfter: resp.Header.Get("Retry-After"), closed: resp.Close}
	}()
	return u
}

// pieces yields b in pieces of at most n bytes.
func pieces(b []byte, n int) func(func([]byte) bool) {
	return func(yield func([]byte) bool) {
		for len(b) > 0 {
			k := min(n, len(b))
			if !yield(b[:k]) {
				return
			}
			b = b[k:]
		}
	}
}

// answer waits for u's answer.
func (u *upload) answer(t *testing.T) result {
	t.Helper()
	r := <-u.resp
	if r.err != nil {
		t.Fatalf("no answer: %v", r.err)
	}
	return r
}

// heapWatch samples the heap in use until stopped and returns its peak.
func heapWatch() (stop func() uint64) {
	var peak uint64
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); <-finished; return peak }
}

// TestStalledUploadsFromOneKeyStayBounded is the review's attack: one key
// sends 60 uploads of 10 MiB that stall just before their end. Four are
// let in (max_in_flight_per_user) and hold 40 MiB of body memory; the
// other 56 are refused before a byte of their body is read, with 429
// too_many_in_flight, Retry-After, and a count; the four are cut off once
// they stall for upload_grace. The heap never holds the 600 MiB the
// uploads declare.
func TestStalledUploadsFromOneKeyStayBounded(t *testing.T) {
	e := newEnv(t, envOptions{cfg: func(c *edge.Config) { c.UploadGrace = 5 * time.Second }})
	addr, _ := realServer(t, e)
	const n, size, slots = 60, 10 << 20, edge.DefaultMaxInFlightPerUser
	body := edgetest.RandomBytes(size) // shared by every sender: the only client-side copy

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	stop := heapWatch()
	// The first four are in (their memory taken) before the rest start, so
	// that the count does not depend on how fast each sender is.
	uploads := make([]*upload, n)
	for i := range uploads {
		uploads[i] = startUpload(t, addr, e.key, size, body, size-1024)
		if i == slots-1 {
			edgetest.WaitFor(t, "four uploads in progress", func() bool { used, _ := e.edge.BodyMemory(); return used == slots*size })
		}
	}
	counts := map[string]int{}
	for i, u := range append(uploads[slots:], uploads[:slots]...) {
		r := u.answer(t)
		counts[strconv.Itoa(r.status)+" "+r.code]++
		if r.status == http.StatusTooManyRequests && r.retryAfter == "" {
			t.Errorf("429 %s without Retry-After", r.code)
		}
		if i == n-slots-1 {
			// Every refusal is in while the four still stall.
			if used, _ := e.edge.BodyMemory(); used != slots*size {
				t.Errorf("body memory %d while four 10 MiB uploads stall, want %d", used, slots*size)
			}
		}
	}
	peakHeap := stop()

	if got, want := counts["429 too_many_in_flight"], n-slots; got != want {
		t.Errorf("%d answers 429 too_many_in_flight, want %d (all: %v)", got, want, counts)
	}
	if got, want := counts["408 upload_too_slow"], slots; got != want {
		t.Errorf("%d answers 408 upload_too_slow, want %d (all: %v)", got, want, counts)
	}
	used, peak := e.edge.BodyMemory()
	if used != 0 {
		t.Errorf("%d bytes of body memory still held after every request ended", used)
	}
	if limit := int64(slots * size); peak > limit {
		t.Errorf("body memory peaked at %d bytes, want at most %d (four uploads of 10 MiB)", peak, limit)
	}
	if grew, limit := int64(peakHeap)-int64(base.HeapInuse), int64(slots*size+64<<20); grew > limit {
		t.Errorf("heap grew by %d MiB, want at most %d MiB", grew>>20, limit>>20)
	}
	if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="too_many_in_flight"}`); got != strconv.Itoa(n-slots) {
		t.Errorf("too_many_in_flight refusals counted %s, want %d", got, n-slots)
	}
	if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="upload_too_slow"}`); got != strconv.Itoa(slots) {
		t.Errorf("upload_too_slow refusals counted %s, want %d", got, slots)
	}
	if got := e.gemini.calls.Load(); got != 0 {
		t.Errorf("%d upstream calls, want none", got)
	}
	// Every slot was given back.
	resp, data := e.post(e.key, "image/png", pngBytes(t, 64, 32))
	decodeOK(t, resp, data)
}

// TestBodyMemoryFullRefusesAtOnce: with max_body_memory taken by uploads
// in progress, the next upload of declared length is refused at once with
// 503 server_busy; one of unknown length takes memory as its bytes arrive,
// so a small one still fits and a large one is refused when it no longer
// does.
func TestBodyMemoryFullRefusesAtOnce(t *testing.T) {
	const mib = 1 << 20
	e := newEnv(t, envOptions{cfg: func(c *edge.Config) {
		c.MaxImageBytes, c.MaxBodyMemory, c.UploadGrace = mib, 2*mib+mib/2, 2*time.Second
	}})
	addr, _ := realServer(t, e)
	body := edgetest.RandomBytes(mib)
	var stalled []*upload
	for i, user := range []string{"bob", "carol"} {
		stalled = append(stalled, startUpload(t, addr, e.newKey(user, ""), mib, body, mib/2))
		edgetest.WaitFor(t, "the upload's memory to be taken", func() bool { used, _ := e.edge.BodyMemory(); return used == int64(i+1)*mib })
	}

	u := startUpload(t, addr, e.newKey("dave", ""), mib, body, mib/2)
	if r := u.answer(t); r.status != http.StatusServiceUnavailable || r.code != "server_busy" || r.retryAfter == "" {
		t.Errorf("declared length over what is left: %+v, want 503 server_busy with Retry-After", r)
	}
	// Unknown length: a small image fits in what is left...
	small := pngBytes(t, 64, 32)
	u = startUpload(t, addr, e.newKey("erin", ""), -1, small, len(small))
	if r := u.answer(t); r.status != http.StatusOK {
		t.Errorf("small chunked upload: %+v, want 200", r)
	}
	// ...a large one is refused once it outgrows it.
	u = startUpload(t, addr, e.newKey("frank", ""), -1, body, mib)
	if r := u.answer(t); r.status != http.StatusServiceUnavailable || r.code != "server_busy" {
		t.Errorf("large chunked upload: %+v, want 503 server_busy", r)
	}
	if _, peak := e.edge.BodyMemory(); peak > e.srv.cfg.MaxBodyMemory {
		t.Errorf("body memory peaked at %d, over max_body_memory %d", peak, e.srv.cfg.MaxBodyMemory)
	}
	for _, u := range stalled {
		if r := u.answer(t); r.code != "upload_too_slow" {
			t.Errorf("stalled upload: %+v, want 408 upload_too_slow", r)
		}
	}
	if used, _ := e.edge.BodyMemory(); used != 0 {
		t.Errorf("%d bytes still held", used)
	}
	if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="server_busy"}`); got != "2" {
		t.Errorf("server_busy refusals counted %s, want 2", got)
	}
}

// TestSlowUploadIsCutOff: an upload that stalls is answered 408
// upload_too_slow, and its connection closed, once upload_grace passes
// without min_upload_bytes_per_second × upload_grace bytes, whether its
// length is declared or not; one that keeps the pace goes through.
func TestSlowUploadIsCutOff(t *testing.T) {
	e := newEnv(t, envOptions{cfg: func(c *edge.Config) {
		c.MinUploadBytesPerSecond, c.UploadGrace = 1000, 200*time.Millisecond // 200 bytes per 200 ms
	}})
	addr, _ := realServer(t, e)
	body := edgetest.RandomBytes(100_000)
	for _, tt := range []struct {
		name   string
		length int64
	}{
		{"declared length", int64(len(body))},
		{"chunked", -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			u := startUpload(t, addr, e.key, tt.length, body, 100)
			r := u.answer(t)
			if r.status != http.StatusRequestTimeout || r.code != "upload_too_slow" || !r.closed {
				t.Errorf("stalled upload: %+v, want 408 upload_too_slow with Connection: close", r)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("cut off after %s, want about 200ms", took)
			}
		})
	}
	t.Run("keeps the pace", func(t *testing.T) {
		img := pngBytes(t, 300, 300)
		u := startUpload(t, addr, e.key, int64(len(img)), img, 0)
		for part := range pieces(img, 150) { // 1500 bytes a second
			time.Sleep(100 * time.Millisecond)
			if _, err := u.conn.Write(part); err != nil {
				t.Fatal(err)
			}
		}
		if r := u.answer(t); r.status != http.StatusOK {
			t.Errorf("upload at the pace: %+v, want 200", r)
		}
	})
}

// countingBytes counts the bytes read through it.
type countingBytes struct {
	r io.Reader
	n int64
}

func (c *countingBytes) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// manyParts is a form of n empty parts and then the image.
func manyParts(n int, img []byte) (body []byte, contentType string) {
	var b bytes.Buffer
	for range n {
		b.WriteString("--B\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n")
	}
	b.WriteString("--B\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n")
	b.Write(img)
	b.WriteString("\r\n--B--\r\n")
	return b.Bytes(), "multipart/form-data; boundary=B"
}

// TestManyMultipartPartsRefused: a form of 200,000 empty parts is refused
// with 400 too_many_parts after max_multipart_parts of them, not parsed to
// its end; a form within the cap is read.
func TestManyMultipartPartsRefused(t *testing.T) {
	img := pngBytes(t, 64, 32)
	body, ct := manyParts(200_000, img)
	partSize := int64(len("--B\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n"))

	t.Run("read no further than the cap", func(t *testing.T) {
		cb := &countingBytes{r: bytes.NewReader(body)}
		mem := edge.NewLease(1 << 30)
		_, _, err := readMultipartImage(cb, "B", 10<<20, int64(len(body)), edge.DefaultMaxMultipartParts, mem)
		if !errors.Is(err, errTooManyParts) {
			t.Fatalf("err %v, want too_many_parts", err)
		}
		// multipart.Reader reads ahead through a 4 KiB buffer.
		if limit := (edge.DefaultMaxMultipartParts+1)*partSize + 4096; cb.n > limit {
			t.Errorf("read %d bytes of the form, want at most %d (the cap's parts and a buffer)", cb.n, limit)
		}
	})
	t.Run("over HTTP", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		start := time.Now()
		resp, data := e.post(e.key, ct, body)
		edgetest.DecodeProblem(t, resp, data, http.StatusBadRequest, "too_many_parts")
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("refusal took %s", took)
		}
		if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="too_many_parts"}`); got != "1" {
			t.Errorf("too_many_parts refusals counted %s, want 1", got)
		}
		// Within the cap (the image the last part) the form is read.
		body, ct := manyParts(edge.DefaultMaxMultipartParts-1, img)
		resp, data = e.post(e.key, ct, body)
		decodeOK(t, resp, data)
		if e.gemini.calls.Load() != 1 {
			t.Errorf("%d upstream calls, want 1", e.gemini.calls.Load())
		}
	})
}

// TestInFlightSlotGivenBackOnEveryPath: refused, failed and successful
// requests all give their in-flight slot and memory back.
func TestInFlightSlotGivenBackOnEveryPath(t *testing.T) {
	e := newEnv(t, envOptions{cfg: func(c *edge.Config) { c.MaxInFlightPerUser = 1 }})
	for _, tt := range []struct {
		name, ct string
		body     []byte
		status   int
	}{
		{"ok", "image/png", pngBytes(t, 8, 8), http.StatusOK},
		{"undecodable", "image/png", []byte("\x89PNG\r\n\x1a\nnope"), http.StatusUnprocessableEntity},
		{"empty", "image/png", nil, http.StatusBadRequest},
		{"wrong type", "image/png", []byte("GIF89a........"), http.StatusUnsupportedMediaType},
		{"ok again", "image/png", pngBytes(t, 8, 8), http.StatusOK},
	} {
		resp, data := e.post(e.key, tt.ct, tt.body)
		if resp.StatusCode != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.status, data)
		}
	}
	if used, _ := e.edge.BodyMemory(); used != 0 {
		t.Errorf("%d bytes still held", used)
	}
	if n := e.edge.UsersInFlight(); n != 0 {
		t.Errorf("in-flight counts left for %d users", n)
	}
}
