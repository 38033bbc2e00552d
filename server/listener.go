package server

import (
	"container/list"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// HTTPServer returns an http.Server for h with the [server] section's
// transport bounds (read-header, read, write and idle timeouts, the header
// size), and ln wrapped so that at most max_connections stay open on it,
// each header block has at most max_header_lines lines (headerConn) and
// the unfinished blocks hold at most max_header_memory bytes in all;
// serve with hs.Serve(ln). It serves the public and the admin handlers
// alike.
func (s *Server) HTTPServer(ln net.Listener, h http.Handler) (*http.Server, net.Listener) {
	lim := &connLimiter{Listener: ln, max: s.cfg.MaxConnections, open: &s.conns, conns: map[net.Conn]*connEntry{},
		refused:   func() { s.refused(layerTransport, "max_connections") },
		headerCap: s.cfg.MaxHeaderMemory,
		evicted:   func() { s.refused(layerTransport, "max_header_memory") },
	}
	lim.lines = func(c net.Conn) net.Conn {
		h := newHeaderConn(c, s.cfg.MaxHeaderLines, s.wallClock, func() { s.refused(layerTransport, "max_header_lines") })
		h.hold = lim.holdHeader
		return h
	}
	hs := &http.Server{
		Addr:              ln.Addr().String(),
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ConnState:         lim.track,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return hs, lim
}

// connLimiter is a listener that holds at most max connections open. At
// the cap, a new connection closes the one that has waited longest without
// a request in progress; when every connection has one, the new connection
// is closed at once. Closing the longest-waiting rather than blocking
// Accept (as golang.org/x/net/netutil.LimitListener does) means idle or
// silent connections, which cost a client nothing to hold, can never lock
// out the next real request. Safe for concurrent use; track is the
// http.Server's ConnState hook.
type connLimiter struct {
	net.Listener
	max     int
	open    *atomic.Int64 // connections held, across the server's listeners
	refused func()
	lines   func(net.Conn) net.Conn // wraps each connection in its headerConn; nil: none
	// headerCap is the most bytes of unfinished header blocks held across
	// the connections (0: no bound); evicted counts a connection closed
	// to keep to it.
	headerCap int64
	evicted   func()

	mu         sync.Mutex
	conns      map[net.Conn]*connEntry
	seq        uint64
	headerHeld int64     // bytes of unfinished header blocks, all connections
	reading    list.List // the connections with such a block, the oldest block first
}

type connEntry struct {
	waiting bool          // new or idle: no request in progress
	since   uint64        // when it began waiting, in Accept/idle order
	header  int64         // bytes of its unfinished header block
	reading *list.Element // in connLimiter.reading while header > 0; its Value is the conn
}

// Accept returns the next connection that fits.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.lines != nil {
			c = l.lines(c)
		}
		if l.admit(c) {
			return c, nil
		}
		c.Close()
		l.refused()
	}
}

func (l *connLimiter) admit(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) >= l.max {
		var oldest net.Conn
		var since uint64
		for oc, e := range l.conns {
			if e.waiting && (oldest == nil || e.since < since) {
				oldest, since = oc, e.since
			}
		}
		if oldest == nil {
			return false
		}
		// Its server goroutine sees the close as a hang-up; its
		// StateClosed finds it gone from the map.
		l.drop(oldest)
	}
	l.seq++
	l.conns[c] = &connEntry{waiting: true, since: l.seq}
	l.open.Add(1)
	return true
}

// track follows each connection's state.
func (l *connLimiter) track(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.conns[c]
	if !ok {
		return // closed to make room
	}
	switch state {
	case http.StateActive:
		e.waiting = false
		if h, ok := c.(*headerConn); ok {
			h.requestStarted()
		}
	case http.StateIdle:
		l.seq++
		e.waiting, e.since = true, l.seq
		if h, ok := c.(*headerConn); ok {
			h.requestDone()
		}
	case http.StateClosed, http.StateHijacked:
		l.forgetHeader(e)
		delete(l.conns, c)
		l.open.Add(-1)
		if h, ok := c.(*headerConn); ok && state == http.StateHijacked {
			h.hijacked()
		}
	}
}

// drop closes c and forgets it; l.mu is held.
func (l *connLimiter) drop(c net.Conn) {
	c.Close()
	l.forgetHeader(l.conns[c])
	delete(l.conns, c)
	l.open.Add(-1)
}

// forgetHeader takes e's unfinished header block out of the count; l.mu
// is held.
func (l *connLimiter) forgetHeader(e *connEntry) {
	l.headerHeld -= e.header
	e.header = 0
	if e.reading != nil {
		l.reading.Remove(e.reading)
		e.reading = nil
	}
}

// holdHeader records that c's unfinished header block holds n bytes (0:
// it has none). Past headerCap in all, the connection whose block began
// longest ago is closed, as many times as it takes: a real client's
// headers arrive in moments, so it is a flood's that go, and a new
// request always finds room. false when c itself was closed.
func (l *connLimiter) holdHeader(c net.Conn, n int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.conns[c]
	if !ok {
		return n == 0 // closed to make room
	}
	if n == 0 {
		l.forgetHeader(e)
		return true
	}
	l.headerHeld += n - e.header
	e.header = n
	if e.reading == nil {
		e.reading = l.reading.PushBack(c)
	}
	for l.headerCap > 0 && l.headerHeld > l.headerCap {
		oldest := l.reading.Front().Value.(net.Conn)
		l.drop(oldest)
		l.evicted()
		if oldest == c {
			return false
		}
	}
	return true
}

// held is how many connections the listener holds open.
func (l *connLimiter) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}
