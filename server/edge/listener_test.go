package edge

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestHugeHeaderBlockRefused: a megabyte of header lines gets 431 after
// max_header_bytes, not a megabyte of memory; a JWT-sized header passes.
func TestHugeHeaderBlockRefused(t *testing.T) {
	e := newTestEdge(t, nil)
	addr := e.addr
	send := func(headers string) int { return sendHeaders(t, addr, headers) }
	var huge strings.Builder
	line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
	for huge.Len() < 1<<20-4096 {
		huge.WriteString(line)
	}
	if got := send(huge.String()); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("1 MiB of headers: status %d, want 431", got)
	}
	if got := send("Authorization: Bearer " + strings.Repeat("j", 8<<10) + "\r\n"); got != http.StatusOK {
		t.Errorf("an 8 KiB token: status %d, want 200", got)
	}
}

// TestIdleConnectionsBounded: connections beyond max_connections close the
// longest idle ones, so the server never holds more than the cap; when
// every connection has a request in progress, a new one is closed at once
// and counted.
func TestIdleConnectionsBounded(t *testing.T) {
	const max = 8
	e := newTestEdge(t, func(c *Config) { c.MaxConnections, c.UploadGrace = max, 2*time.Second })
	addr, lim := e.addr, e.lim
	type client struct {
		conn net.Conn
		r    *bufio.Reader
	}
	var clients []client
	for i := range 3 * max {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c := client{conn, bufio.NewReader(conn)}
		io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		resp.Body.Close()
		clients = append(clients, c)
		if got := lim.held(); got > max {
			t.Fatalf("after %d connections the server holds %d, want at most %d", i+1, got, max)
		}
	}
	if got := lim.held(); got != max {
		t.Errorf("server holds %d connections, want %d", got, max)
	}
	// From the clients' side: the oldest were closed, the newest are open.
	closed := 0
	for _, c := range clients {
		c.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.r.ReadByte(); errors.Is(err, io.EOF) {
			closed++
		}
	}
	if got, want := closed, 2*max; got != want {
		t.Errorf("%d of %d idle connections closed by the server, want %d", got, len(clients), want)
	}

	// Every connection busy with an upload: the next is closed unanswered.
	body := randomBytes(100_000)
	var uploads []*upload
	for i := range max {
		uploads = append(uploads, startUpload(t, addr, fmt.Sprintf("u%d", i), int64(len(body)), body, 1000))
	}
	waitFor(t, "every upload to be in progress", func() bool {
		lim.mu.Lock()
		defer lim.mu.Unlock()
		busy := 0
		for _, c := range lim.conns {
			if !c.waiting {
				busy++
			}
		}
		return busy == max
	})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
		t.Error("a connection over the cap with every other busy was answered, want it closed")
	}
	if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="max_connections"}`); got != "1" {
		t.Errorf("max_connections refusals counted %s, want 1", got)
	}
	for _, u := range uploads {
		u.answer(t)
	}
}

// TestFreshConnectionSparedAtCap: at the cap, a connection whose request
// has not been read yet is not closed to make room while an idle
// keep-alive connection can be, for freshGrace after its accept; past it,
// or when every waiting connection is fresh, the longest-waiting goes.
// Before, the longest-waiting went whatever it was, and a fast churn of
// connections closed a real client's new connection before its request.
func TestFreshConnectionSparedAtCap(t *testing.T) {
	now := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	var open atomic.Int64
	l := &connLimiter{max: 2, open: &open, conns: map[net.Conn]*connEntry{}, refused: func() {}, now: func() time.Time { return now }}
	conn := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return a
	}
	admit := func(c net.Conn) {
		t.Helper()
		if ok, _ := l.admit(c); !ok {
			t.Fatal("a new connection was refused with waiting ones to close")
		}
	}
	held := func(want ...net.Conn) {
		t.Helper()
		if got := len(l.conns); got != len(want) {
			t.Fatalf("held %d connections, want %d", got, len(want))
		}
		for i, c := range want {
			if _, ok := l.conns[c]; !ok {
				t.Fatalf("connection %d of %d was closed, want it held", i+1, len(want))
			}
		}
		if got := open.Load(); got != int64(len(want)) {
			t.Fatalf("open count %d, want %d", got, len(want))
		}
	}

	idle, fresh := conn(), conn()
	admit(idle)
	admit(fresh) // connected before idle's request, so it has waited longer
	l.track(idle, http.StateActive)
	l.track(idle, http.StateIdle)

	now = now.Add(10 * time.Millisecond)
	next := conn()
	admit(next)
	held(fresh, next) // the idle one made room, not the fresh one

	// Past its grace without a request, fresh is a silent connection like
	// any other, and the longest-waiting.
	l.track(next, http.StateActive)
	l.track(next, http.StateIdle)
	now = now.Add(freshGrace)
	late := conn()
	admit(late)
	held(next, late)

	// Every waiting connection fresh: the longest-waiting of them goes,
	// so a new connection is never locked out by fresh ones.
	l.track(next, http.StateActive)
	l.track(next, http.StateClosed)
	newer := conn()
	admit(newer)
	held(late, newer)
	newest := conn()
	admit(newest)
	held(newer, newest)

	// A request arrived but not read yet: that connection is passed over.
	unread := map[net.Conn]bool{newer: true}
	l.unread = func(c net.Conn) bool { return unread[c] }
	later := conn()
	admit(later)
	held(newer, later)
	// Every waiting connection with a request to read: the server is
	// behind, and the new connection waits (Accept holds it a moment).
	unread[later] = true
	if ok, behind := l.admit(conn()); ok || !behind {
		t.Errorf("admit = %v, behind %v; want the new connection held back while the others' requests are read", ok, behind)
	}
	held(newer, later)

	// Every connection with a request in progress: the new one is refused.
	l.unread = nil
	l.track(newer, http.StateActive)
	l.track(later, http.StateActive)
	if ok, behind := l.admit(conn()); ok || behind {
		t.Errorf("admit = %v, behind %v; want the new connection refused over the cap with every other busy", ok, behind)
	}
	held(newer, later)
}

// TestHeaderLinesRefused: a header block of more than max_header_lines
// lines gets 431, however few its bytes, and is counted; a block of
// max_header_lines passes.
func TestHeaderLinesRefused(t *testing.T) {
	e := newTestEdge(t, nil)
	addr := e.addr
	lines := func(n int) string {
		var b strings.Builder
		for i := range n - 1 { // Host is one
			fmt.Fprintf(&b, "%x: v\r\n", i)
		}
		return b.String()
	}
	send := func(headers string) int { return sendHeaders(t, addr, headers) }
	if got := send(lines(DefaultMaxHeaderLines)); got != http.StatusOK {
		t.Errorf("%d header lines: status %d, want 200", DefaultMaxHeaderLines, got)
	}
	if got := send(lines(DefaultMaxHeaderLines + 1)); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d header lines: status %d, want 431", DefaultMaxHeaderLines+1, got)
	}
	if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="max_header_lines"}`); got != "1" {
		t.Errorf("max_header_lines refusals counted %s, want 1", got)
	}
}

// TestHeaderLinesFollowTheFraming: on one keep-alive connection, the lines
// of a body (of a Content-Length, or chunked) are not header lines, and a
// request sent behind another in the same write is counted as a block of
// its own.
func TestHeaderLinesFollowTheFraming(t *testing.T) {
	e := newTestEdge(t, nil)
	addr := e.addr
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	many := strings.Repeat("\n", 3*DefaultMaxHeaderLines)
	var lines strings.Builder
	for i := range DefaultMaxHeaderLines - 1 {
		fmt.Fprintf(&lines, "%x: v\r\n", i)
	}
	get := "GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines.String() + "\r\n"
	steps := []struct {
		name, send string
		answers    int
	}{
		{"a body of a Content-Length", fmt.Sprintf("POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(many), many), 1},
		{"after it", get, 1},
		{"a chunked body", fmt.Sprintf("POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(many), many), 1},
		{"after it", get, 1},
		{"two in one write", get + get, 2},
		{"a chunked body and a request in one write", fmt.Sprintf("POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(many), many) + get, 2},
	}
	for _, step := range steps {
		if _, err := io.WriteString(conn, step.send); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		for range step.answers {
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatalf("%s: no answer: %v", step.name, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusRequestHeaderFieldsTooLarge || resp.StatusCode == http.StatusBadRequest {
				t.Errorf("%s: status %d", step.name, resp.StatusCode)
			}
		}
	}
	// A block one line over behind a request in the same write: the lines
	// are counted as they are read, so the 431 is the first answer, and the
	// last.
	io.WriteString(conn, get+"GET /healthz HTTP/1.1\r\nHost: x\r\nX-One-More: v\r\n"+lines.String()+"\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("one line over, pipelined: no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("one line over, pipelined: status %d, want 431", resp.StatusCode)
	}
	if _, err := http.ReadResponse(r, nil); err == nil {
		t.Error("an answer after the 431")
	}
}

// TestHeaderConnScan: the line count follows a header block and its body
// however the bytes are split into reads.
func TestHeaderConnScan(t *testing.T) {
	for _, tt := range []struct {
		name   string
		stream string
		ok     bool
	}{
		{"two lines", "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n", true},
		{"three lines", "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n", false},
		{"bare newlines", "GET / HTTP/1.1\na: 1\nb: 2\nc: 3\n", false},
		{"a body's lines", "POST / HTTP/1.1\r\nContent-Length: 8\r\n\r\n\n\n\n\n\n\n\n\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n", true},
		{"the block after a body", "POST / HTTP/1.1\r\ncontent-length:  2 \r\n\r\n\n\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n", false},
		{"no body, then a block", "GET / HTTP/1.1\r\na: 1\r\n\r\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n", false},
		{"a chunked body's lines", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n6;x=y\r\n\n\n\n\n\n\n\r\nA\r\n\n\n\n\n\n\n\n\n\n\n\r\n0\r\n\r\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n", true},
		{"the block after a chunked body", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n\n\r\n0\r\n\r\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n", false},
		{"a chunked body's trailers", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\na: 1\r\nb: 2\r\nc: 3\r\n", false},
		{"chunked wins over a length", "POST / HTTP/1.1\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n", false},
		{"another coding until done", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n\n\n\n\n\n\n", true},
		{"a bad chunk size until done", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\n\n\n\n\n\n", true},
		{"two lengths", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n\n\n\n\n\n\n", true},
	} {
		for _, size := range []int{1, 3, len(tt.stream)} {
			t.Run(fmt.Sprintf("%s/%d", tt.name, size), func(t *testing.T) {
				h := &headerConn{max: 2}
				ok := true
				for b := []byte(tt.stream); len(b) > 0 && ok; {
					n := min(size, len(b))
					ok = h.scan(b[:n])
					b = b[n:]
				}
				if ok != tt.ok {
					t.Errorf("scan = %v, want %v", ok, tt.ok)
				}
			})
		}
	}
}

// FuzzHeaderConnScan: however a stream is split into reads, the count
// comes to the same verdict and the same state, and never panics.
func FuzzHeaderConnScan(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n"), uint8(3))
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n\n\n\nGET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n"), uint8(1))
	f.Add([]byte("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;e\r\n\n\n\n\r\n0\r\nt: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n"), uint8(5))
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		scan := func(size int) (bool, *headerConn) {
			h := &headerConn{max: 2}
			for b := stream; len(b) > 0; {
				n := min(size, len(b))
				if !h.scan(b[:n]) {
					return false, h
				}
				b = b[n:]
			}
			return true, h
		}
		whole, hw := scan(len(stream) + 1)
		split, hs := scan(int(size%64) + 1)
		if whole != split || hw.state != hs.state || hw.lines != hs.lines || hw.blocks != hs.blocks || hw.left != hs.left {
			t.Errorf("whole: %v state %d lines %d blocks %d left %d; in reads of %d: %v state %d lines %d blocks %d left %d",
				whole, hw.state, hw.lines, hw.blocks, hw.left, size%64+1, split, hs.state, hs.lines, hs.blocks, hs.left)
		}
	})
}

// TestHeaderMemoryBounded: when the unfinished header blocks would hold
// more than max_header_memory, the connection whose block began longest
// ago is closed and counted; the others stay, and a new request is
// served.
func TestHeaderMemoryBounded(t *testing.T) {
	const block = 20_000 // 20 lines of 1,000 bytes, never ended
	e := newTestEdge(t, func(c *Config) { c.MaxHeaderMemory = 3*block + block/2 })
	addr, lim := e.addr, e.lim
	heldBytes := func() int64 {
		lim.mu.Lock()
		defer lim.mu.Unlock()
		return lim.headerHeld
	}
	line := "X-Pad: " + strings.Repeat("a", 991) + "\r\n"
	var conns []net.Conn
	for i := range 4 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
		if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\n"+strings.Repeat(line, block/len(line))); err != nil {
			t.Fatal(err)
		}
		want := int64(min(i+1, 3)) * block // the fourth pushes the first out
		for deadline := time.Now().Add(5 * time.Second); heldBytes() < want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %d connections the blocks hold %d bytes, want %d", i+1, heldBytes(), want)
			}
		}
	}
	if got, most := heldBytes(), e.cfg.MaxHeaderMemory; got > most {
		t.Errorf("the blocks hold %d bytes, more than max_header_memory %d", got, most)
	}
	for i, conn := range conns {
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := conn.Read(make([]byte, 1))
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		if i == 0 && timedOut {
			t.Error("the oldest block's connection is still open")
		}
		if i > 0 && !timedOut {
			t.Errorf("connection %d: %v, want it still open", i, err)
		}
	}
	if got := metric(t, e, `breakwater_refusals_total{layer="transport",reason="max_header_memory"}`); got != "1" {
		t.Errorf("max_header_memory closings counted %s, want 1", got)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a new request: status %d, want 200", resp.StatusCode)
	}
	for _, conn := range conns {
		conn.Close()
	}
	for deadline := time.Now().Add(5 * time.Second); heldBytes() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("closed connections still hold %d bytes", heldBytes())
		}
	}
}

// sendHeaders sends GET /healthz with headers (each line ending in CRLF)
// on a connection of its own and returns the status of the answer.
func sendHeaders(t *testing.T, addr, headers string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"+headers+"\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
