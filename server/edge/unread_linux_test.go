package edge

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestUnreadBytes: a socket whose peer's bytes have arrived and not been
// read has unread bytes; once read, it has none.
func TestUnreadBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	// The listener hands the server each connection in its headerConn:
	// the look must reach the socket through it.
	server = newHeaderConn(server, 100, time.Now, func() {})
	if unreadBytes(server) {
		t.Fatal("unread bytes before the client sent any")
	}
	if _, err := io.WriteString(client, "GET / HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bytes to arrive", func() bool { return unreadBytes(server) })
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(server, buf, len("GET / HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	if unreadBytes(server) {
		t.Error("unread bytes after they were read")
	}
}
