package server

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// Go's HTTP server bounds a header block by its bytes (max_header_bytes)
// but allocates for each of its lines: a map entry, a key and a value. A
// block of short lines costs about ten times its bytes (32,000 bytes of
// 1-byte values held about 340 KiB while the block was unfinished). So each
// connection counts the lines of its header blocks as their bytes arrive,
// before the server parses them, and a block of more than max_header_lines
// lines is answered 431 and the connection closed.

// errTooManyHeaderLines ends a connection whose header block has more
// lines than server.max_header_lines.
var errTooManyHeaderLines = errors.New("server: more header lines than server.max_header_lines")

// headerTooLarge is what Go's server answers to a header block over
// max_header_bytes, answered here to one over max_header_lines.
const headerTooLarge = "HTTP/1.1 431 Request Header Fields Too Large\r\n" +
	"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"

// headerConn is a connection that counts the lines of each request's
// header block in the bytes read from it. To know where the next block
// starts it follows the framing: a block without Content-Length and
// Transfer-Encoding has no body, so the next block follows at once; one
// with a Content-Length of n has n bytes of body; any other body (chunked)
// lasts until the server has finished that request (requestDone, from the
// ConnState hook, counts them). Read is called by the server's one reading
// goroutine at a time; only the ConnState hook's calls come from another.
type headerConn struct {
	net.Conn
	max     int              // most header lines, the request line not counted
	now     func() time.Time // for the refusal's write deadline
	refused func()           // counts a refusal
	done    atomic.Int64     // requests the server has finished
	active  atomic.Bool      // the server is serving a request
	off     atomic.Bool      // hijacked: the bytes are no longer HTTP/1.1's

	state   lineState
	lines   int   // lines of the block so far, the request line included
	blocks  int64 // header blocks ended so far: the requests read
	left    int64 // bytes of body still to come (inBody)
	length  int64 // the block's Content-Length so far; noLength, or unknownLength
	lineLen int   // bytes of the current line so far
	head    [48]byte
}

type lineState uint8

const (
	inHeaders lineState = iota // counting a header block
	inBody                     // a body of known length: left bytes to come
	untilDone                  // a body of unknown length: until the request is done
)

const (
	noLength      = -1
	unknownLength = -2
)

func newHeaderConn(c net.Conn, max int, now func() time.Time, refused func()) *headerConn {
	return &headerConn{Conn: c, max: max, now: now, refused: refused, length: noLength}
}

// requestStarted is told by the server that it has read a request's
// header block and serves it.
func (h *headerConn) requestStarted() { h.active.Store(true) }

// requestDone is told by the server that a request is over: if its body
// was of unknown length, what follows is the next header block.
func (h *headerConn) requestDone() {
	h.done.Add(1)
	h.active.Store(false)
}

// hijacked stops the counting for good.
func (h *headerConn) hijacked() { h.off.Store(true) }

func (h *headerConn) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	if h.off.Load() {
		return n, err
	}
	if h.state == untilDone && h.done.Load() >= h.blocks {
		h.startBlock()
	}
	if n > 0 && !h.scan(p[:n]) {
		h.refuse()
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: h.LocalAddr(), Addr: h.RemoteAddr(), Err: errTooManyHeaderLines}
	}
	return n, err
}

// refuse answers 431 as Go's server does for too many header bytes, and
// half-closes the connection so that the client may read it; but not
// while a request is in progress (this is then the server's read behind
// the handler, and the answer is the handler's to write): the connection
// just ends.
func (h *headerConn) refuse() {
	h.refused()
	if h.active.Load() {
		return
	}
	_ = h.Conn.SetWriteDeadline(h.now().Add(time.Second))
	_, _ = h.Conn.Write([]byte(headerTooLarge))
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// CloseWrite lets the server half-close the connection, as it does a
// plain TCP connection's.
func (h *headerConn) CloseWrite() error {
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (h *headerConn) startBlock() {
	h.state, h.lines, h.length, h.lineLen = inHeaders, 0, noLength, 0
}

// scan follows b through the framing; false when a header block has
// gone over max lines.
func (h *headerConn) scan(b []byte) bool {
	for len(b) > 0 {
		switch h.state {
		case untilDone:
			return true
		case inBody:
			k := min(int64(len(b)), h.left)
			h.left -= k
			b = b[k:]
			if h.left == 0 {
				h.startBlock()
			}
		case inHeaders:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				h.take(b)
				return true
			}
			h.take(b[:i])
			b = b[i+1:]
			if !h.endLine() {
				return false
			}
		}
	}
	return true
}

// take adds b to the current line.
func (h *headerConn) take(b []byte) {
	if h.lineLen < len(h.head) {
		copy(h.head[h.lineLen:], b)
	}
	h.lineLen += len(b)
}

// endLine ends the current line: the block ends at an empty line after
// the request line; false when the block has gone over max lines.
func (h *headerConn) endLine() bool {
	n := h.lineLen
	h.lineLen = 0
	if n > 0 && n <= len(h.head) && h.head[n-1] == '\r' {
		n--
	}
	if n == 0 && h.lines > 0 {
		h.blocks++
		switch {
		case h.length == noLength || h.length == 0:
			h.startBlock()
		case h.length > 0:
			h.state, h.left = inBody, h.length
		default:
			h.state = untilDone
		}
		return true
	}
	h.lines++
	if h.lines > h.max+1 {
		return false
	}
	h.framing(h.head[:min(n, len(h.head))], n)
	return true
}

// framing notes what a header line of n bytes, head its first ones, says
// of the body's length.
func (h *headerConn) framing(head []byte, n int) {
	name, value, ok := bytes.Cut(head, []byte{':'})
	if !ok {
		return
	}
	switch {
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		h.length = unknownLength
	case bytes.EqualFold(name, []byte("Content-Length")):
		v, err := strconv.ParseInt(string(bytes.Trim(value, " \t")), 10, 64)
		switch {
		case n > len(h.head) || err != nil || v < 0:
			h.length = unknownLength
		case h.length == noLength:
			h.length = v
		case h.length != v:
			h.length = unknownLength
		}
	}
}
