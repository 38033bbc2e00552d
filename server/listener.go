package server

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// HTTPServer returns an http.Server for h with the [server] section's
// transport bounds (read-header, read, write and idle timeouts, the header
// size), and ln wrapped so that at most max_connections stay open on it
// and each header block has at most max_header_lines lines (headerConn);
// serve with hs.Serve(ln). It serves the public and the admin handlers
// alike.
func (s *Server) HTTPServer(ln net.Listener, h http.Handler) (*http.Server, net.Listener) {
	lim := &connLimiter{Listener: ln, max: s.cfg.MaxConnections, open: &s.conns, conns: map[net.Conn]*connEntry{},
		refused: func() { s.refused(layerTransport, "max_connections") },
		lines: func(c net.Conn) net.Conn {
			return newHeaderConn(c, s.cfg.MaxHeaderLines, s.wallClock, func() { s.refused(layerTransport, "max_header_lines") })
		}}
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

	mu    sync.Mutex
	conns map[net.Conn]*connEntry
	seq   uint64
}

type connEntry struct {
	waiting bool   // new or idle: no request in progress
	since   uint64 // when it began waiting, in Accept/idle order
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
		oldest.Close()
		delete(l.conns, oldest)
		l.open.Add(-1)
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
		delete(l.conns, c)
		l.open.Add(-1)
		if h, ok := c.(*headerConn); ok && state == http.StateHijacked {
			h.hijacked()
		}
	}
}

// held is how many connections the listener holds open.
func (l *connLimiter) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}
