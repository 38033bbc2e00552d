package edge

import (
	"container/list"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// HTTPServer returns an http.Server for h with the [server] section's
// transport bounds (read-header, read, write and idle timeouts, the header
// size), and ln wrapped so that at most max_connections stay open on it,
// each header block has at most max_header_lines lines (headerConn) and
// the unfinished blocks hold at most max_header_memory bytes in all;
// serve with hs.Serve(ln). It serves the public and the admin handlers
// alike.
func (e *Edge) HTTPServer(ln net.Listener, h http.Handler) (*http.Server, net.Listener) {
	lim := &connLimiter{Listener: ln, max: e.cfg.MaxConnections, open: &e.conns, conns: map[net.Conn]*connEntry{},
		refused:   func() { e.Refused(LayerTransport, "max_connections") },
		now:       e.now,
		headerCap: e.cfg.MaxHeaderMemory,
		evicted:   func() { e.Refused(LayerTransport, "max_header_memory") },
	}
	lim.lines = func(c net.Conn) net.Conn {
		h := newHeaderConn(c, e.cfg.MaxHeaderLines, e.wallClock, func() { e.Refused(LayerTransport, "max_header_lines") })
		h.hold = lim.holdHeader
		return h
	}
	hs := &http.Server{
		Addr:              ln.Addr().String(),
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       e.cfg.IdleTimeout,
		MaxHeaderBytes:    e.cfg.MaxHeaderBytes,
		ConnState:         lim.track,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelWarn),
	}
	return hs, lim
}

// connLimiter is a listener that holds at most max connections open. At
// the cap, a new connection closes the one that has waited longest without
// a request in progress; when every connection has one, the new connection
// is closed at once. Closing the longest-waiting rather than blocking
// Accept (as golang.org/x/net/netutil.LimitListener does) means idle or
// silent connections, which cost a client nothing to hold, can never lock
// out the next real request.
//
// Two kinds of waiting connection are spared from making room, since
// closing either loses a request where closing an idle one costs its
// client only a reconnect: one whose request has arrived but not been
// read yet (bytes unread in the kernel: the server is behind, not the
// client), and one that has had no request yet, for freshGrace after its
// accept. Without that, a fast enough churn of connections (at the cap,
// each new one closes the longest-waiting) closed a real client's new
// connection before its request was read, and its retry's too. When every
// waiting connection is fresh, the longest-waiting fresh one without
// unread bytes goes, so a stream of silent connections cannot lock new
// ones out. When the ones that could go all have a request to read, the
// new connection waits a moment (see maxBehind) for the server to read
// them. Safe for concurrent use; track is the http.Server's ConnState
// hook.
type connLimiter struct {
	net.Listener
	max     int
	open    *atomic.Int64 // connections held, across the server's listeners
	refused func()
	now     func() time.Time
	unread  func(net.Conn) bool     // whether the kernel holds bytes not yet read; nil: unreadBytes
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

// freshGrace is how long a new connection is spared from making room
// for another before its first request: time enough for a client to send
// it after connecting, even a round trip away on a slow network.
const freshGrace = time.Second

type connEntry struct {
	waiting  bool          // new or idle: no request in progress
	since    uint64        // when it began waiting, in Accept/idle order
	fresh    bool          // no request read yet
	accepted time.Time     // for fresh: when it was accepted
	header   int64         // bytes of its unfinished header block
	reading  *list.Element // in connLimiter.reading while header > 0; its Value is the conn
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
		if l.admitOrWait(c) {
			return c, nil
		}
		c.Close()
		l.refused()
	}
}

// behindPause and maxBehind: while the connections that could make room
// for a new one all have a request waiting to be read, Accept holds the
// new connection, looking again every behindPause, for at most
// maxBehind, before it closes it: the server is behind on reading, and
// accepting no faster than it reads is the fair answer (the next clients
// wait in the listen backlog in the order they came).
const (
	behindPause = time.Millisecond
	maxBehind   = 250 * time.Millisecond
)

// admitOrWait is admit, waiting out a moment when the server is behind.
func (l *connLimiter) admitOrWait(c net.Conn) bool {
	for waited := time.Duration(0); ; waited += behindPause {
		ok, behind := l.admit(c)
		if ok || !behind || waited >= maxBehind {
			return ok
		}
		time.Sleep(behindPause)
	}
}

// admit takes c in if it fits or a waiting connection can make room for
// it; behind says it did not because each connection that could have has
// a request waiting to be read.
func (l *connLimiter) admit(c net.Conn) (ok, behind bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if len(l.conns) >= l.max {
		oldest, behind := l.oldestWaiting(now)
		if oldest == nil {
			return false, behind
		}
		// Its server goroutine sees the close as a hang-up; its
		// StateClosed finds it gone from the map.
		l.drop(oldest)
	}
	l.seq++
	l.conns[c] = &connEntry{waiting: true, since: l.seq, fresh: true, accepted: now}
	l.open.Add(1)
	return true, false
}

// maxUnreadChecks bounds how many of the longest-waiting connections
// admit looks at for unread bytes: when that many have a request waiting,
// the server is behind.
const maxUnreadChecks = 8

// oldestWaiting is the connection to close for a new one at now: the
// longest-waiting one past its fresh grace, or when every waiting
// connection is within it, the longest-waiting of those; passing over
// those with unread bytes. nil when there is none, with behind set when
// it passed some over. The caller holds l.mu.
func (l *connLimiter) oldestWaiting(now time.Time) (oldest net.Conn, behind bool) {
	unread := l.unread
	if unread == nil {
		unread = unreadBytes
	}
	var skip []net.Conn
	for range maxUnreadChecks {
		var oldestFresh net.Conn
		var since, sinceFresh uint64
		oldest = nil
		for c, e := range l.conns {
			switch {
			case !e.waiting || slices.Contains(skip, c):
			case e.fresh && now.Sub(e.accepted) < freshGrace:
				if oldestFresh == nil || e.since < sinceFresh {
					oldestFresh, sinceFresh = c, e.since
				}
			case oldest == nil || e.since < since:
				oldest, since = c, e.since
			}
		}
		if oldest == nil {
			oldest = oldestFresh
		}
		if oldest == nil || !unread(oldest) {
			return oldest, oldest == nil && len(skip) > 0
		}
		skip = append(skip, oldest)
	}
	return nil, true
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
		e.waiting, e.fresh = false, false
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
