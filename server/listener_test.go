package server

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
	e := newEnv(t, envOptions{})
	addr, _ := realServer(t, e)
	send := func(headers string) int {
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
	e := newEnv(t, envOptions{cfg: func(c *Config) { c.MaxConnections, c.UploadGrace = max, 2*time.Second }})
	addr, lim := realServer(t, e)
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
		uploads = append(uploads, startUpload(t, addr, e.newKey(fmt.Sprintf("u%d", i), ""), int64(len(body)), body, 1000))
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
