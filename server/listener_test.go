package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
