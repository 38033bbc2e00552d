package edge

import (
	"bytes"
	"errors"
	"io"
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
// lines is answered 431 and the connection closed. It also reports the
// bytes of its unfinished block to the listener (connLimiter.holdHeader),
// which keeps all of them within max_header_memory: a long line costs the
// server a few times its bytes while it is assembled.

// errTooManyHeaderLines ends a connection whose header block has more
// lines than server.max_header_lines, errHeaderMemory one whose unfinished
// block was the oldest when the blocks held max_header_memory.
var (
	errTooManyHeaderLines = errors.New("server: more header lines than server.max_header_lines")
	errHeaderMemory       = errors.New("server: unfinished header blocks at server.max_header_memory: the oldest closed")
)

// headerTooLarge is what Go's server answers to a header block over
// max_header_bytes, answered here to one over max_header_lines.
const headerTooLarge = "HTTP/1.1 431 Request Header Fields Too Large\r\n" +
	"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"

// headerConn is a connection that counts the lines of each request's
// header block in the bytes read from it. To know where the next block
// starts it follows the framing: a block without Content-Length and
// Transfer-Encoding has no body, so the next block follows at once; one
// with a Content-Length of n has n bytes of body; a chunked body is
// followed chunk by chunk, and its trailer lines are counted as header
// lines. A framing it cannot follow (one the server refuses anyway) lasts
// until the server has finished that request (requestDone, from the
// ConnState hook, counts them). Read is called by the server's one reading
// goroutine at a time; only the ConnState hook's calls come from another.
type headerConn struct {
	net.Conn
	max     int              // most header lines, the request line not counted
	now     func() time.Time // for the refusal's write deadline
	refused func()           // counts a refusal
	// hold reports the bytes of the unfinished header block (0: none)
	// when they change, and is false when the connection was closed to
	// bound them (connLimiter.holdHeader); nil: not reported.
	hold   func(c net.Conn, n int64) bool
	done   atomic.Int64 // requests the server has finished
	active atomic.Bool  // the server is serving a request
	off    atomic.Bool  // hijacked: the bytes are no longer HTTP/1.1's

	state   lineState
	lines   int      // lines of the block so far, the request line included
	blocks  int64    // header blocks ended so far: the requests read
	left    int64    // bytes of body or chunk still to come (inBody, inChunk)
	body    bodyKind // what the block's headers say of its body so far
	length  int64    // the block's Content-Length (sized)
	lineLen int      // bytes of the current line so far
	head    [48]byte // its first bytes
	pending int64    // bytes of the unfinished header block (or trailers)
	held    int64    // pending as last reported to hold
}

type lineState uint8

const (
	inHeaders   lineState = iota // counting a header block
	inBody                       // a body of known length: left bytes to come
	inChunkSize                  // a chunk's size line
	inChunk                      // a chunk's data: left bytes to come
	inChunkEnd                   // the line end after a chunk's data
	inTrailers                   // counting the trailer lines of a chunked body
	untilDone                    // a body it cannot follow: until the request is done
)

// bodyKind is what a header block says of its body.
type bodyKind uint8

const (
	noBody bodyKind = iota
	sized
	chunked
	unknown
)

func newHeaderConn(c net.Conn, max int, now func() time.Time, refused func()) *headerConn {
	return &headerConn{Conn: c, max: max, now: now, refused: refused}
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
		return 0, h.readError(errTooManyHeaderLines)
	}
	if h.hold != nil && h.pending != h.held {
		if !h.hold(h, h.pending) {
			return 0, h.readError(errHeaderMemory)
		}
		h.held = h.pending
	}
	return n, err
}

// readError is err as the server takes a broken connection's: it closes
// the connection without an answer.
func (h *headerConn) readError(err error) error {
	return &net.OpError{Op: "read", Net: "tcp", Source: h.LocalAddr(), Addr: h.RemoteAddr(), Err: err}
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

// ReadFrom lets the server write a response body with the connection's
// own ReadFrom (sendfile, splice), as it does on a plain TCP connection.
func (h *headerConn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(h.Conn, r) }

// CloseWrite lets the server half-close the connection, as it does a
// plain TCP connection's.
func (h *headerConn) CloseWrite() error {
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (h *headerConn) startBlock() {
	h.state, h.lines, h.body, h.lineLen, h.pending = inHeaders, 0, noBody, 0, 0
}

// maxChunkLine is the longest chunk-size line followed; Go's server
// refuses longer ones.
const maxChunkLine = 4096

// scan follows b through the framing; false when a header block, or a
// chunked body's trailers, has gone over max lines.
func (h *headerConn) scan(b []byte) bool {
	for len(b) > 0 {
		switch h.state {
		case untilDone:
			return true
		case inBody, inChunk:
			k := min(int64(len(b)), h.left)
			h.left -= k
			b = b[k:]
			if h.left == 0 && h.state == inBody {
				h.startBlock()
			} else if h.left == 0 {
				h.state = inChunkEnd
			}
		default: // a line: of headers, of trailers, a chunk's size or end
			i := bytes.IndexByte(b, '\n')
			if h.state == inHeaders || h.state == inTrailers {
				if i < 0 {
					h.pending += int64(len(b))
				} else {
					h.pending += int64(i + 1)
				}
			}
			if i < 0 {
				h.take(b)
				if h.lineLen > maxChunkLine && (h.state == inChunkSize || h.state == inChunkEnd) {
					h.state = untilDone
				}
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

// endLine ends the current line; false when a block has gone over max
// lines.
func (h *headerConn) endLine() bool {
	n := h.lineLen
	h.lineLen = 0
	if n > 0 && n <= len(h.head) && h.head[n-1] == '\r' {
		n--
	}
	line := h.head[:min(n, len(h.head))]
	switch h.state {
	case inChunkSize:
		size, ok := chunkSize(line, n)
		switch {
		case !ok || n > maxChunkLine:
			h.state = untilDone
		case size == 0:
			h.state, h.lines = inTrailers, 1 // as if after a request line
		default:
			h.state, h.left = inChunk, size
		}
		return true
	case inChunkEnd:
		if n != 0 {
			h.state = untilDone // Go's server refuses it
		} else {
			h.state = inChunkSize
		}
		return true
	case inTrailers:
		if n == 0 {
			h.startBlock()
			return true
		}
	case inHeaders:
		if n == 0 && h.lines > 0 {
			h.endBlock()
			return true
		}
	}
	h.lines++
	if h.lines > h.max+1 {
		return false
	}
	if h.state == inHeaders {
		h.framing(line, n)
	}
	return true
}

// endBlock moves past the end of a header block, to its body.
func (h *headerConn) endBlock() {
	h.blocks++
	h.pending = 0
	switch {
	case h.body == noBody || h.body == sized && h.length == 0:
		h.startBlock()
	case h.body == sized:
		h.state, h.left = inBody, h.length
	case h.body == chunked:
		h.state = inChunkSize
	default:
		h.state = untilDone
	}
}

// framing notes what a header line of n bytes, head its first ones, says
// of the body, as Go's server reads it: Transfer-Encoding chunked wins
// over a Content-Length; anything else it would refuse or cannot be
// followed here.
func (h *headerConn) framing(head []byte, n int) {
	name, value, ok := bytes.Cut(head, []byte{':'})
	if !ok {
		return
	}
	value = bytes.Trim(value, " \t")
	switch {
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		if n <= len(h.head) && bytes.EqualFold(value, []byte("chunked")) && h.body != chunked && h.body != unknown {
			h.body = chunked
		} else {
			h.body = unknown
		}
	case bytes.EqualFold(name, []byte("Content-Length")):
		v, err := strconv.ParseInt(string(value), 10, 64)
		switch {
		case h.body == chunked || h.body == unknown:
		case n > len(h.head) || err != nil || v < 0:
			h.body = unknown
		case h.body == noBody:
			h.body, h.length = sized, v
		case h.length != v:
			h.body = unknown
		}
	}
}

// chunkSize reads a chunk-size line of n bytes, head its first ones: hex
// digits (at most 16), then maybe extensions after ';'.
func chunkSize(head []byte, n int) (int64, bool) {
	var size uint64
	digits := 0
	for _, c := range head {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			if digits == 0 || (c != ';' && c != ' ' && c != '\t') {
				return 0, false
			}
			return int64(size), size < 1<<62
		}
		if digits++; digits > 16 {
			return 0, false
		}
		size = size<<4 | uint64(d)
	}
	if digits == 0 || n > len(head) && digits == len(head) {
		return 0, false
	}
	return int64(size), size < 1<<62
}

// NetConn is the connection headerConn wraps, for what needs the socket
// itself (the unread-bytes look of the connection cap).
func (h *headerConn) NetConn() net.Conn { return h.Conn }
