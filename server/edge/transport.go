package edge

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/server/keys"
)

// This file bounds what request bodies cost, whatever clients send: the
// memory they hold service-wide, the requests one user has in progress,
// the rate an upload must keep (server/api's readMultipartImage bounds the
// parts of a form); listener.go bounds the connections. Each bound is cheap, in memory
// and always enforced: they guard resources, not money, and have no
// machinery that could fail.

// ErrReadTooSlow is what a paced body returns once its read deadline has
// passed.
var ErrReadTooSlow = errors.New("server: upload slower than server.min_upload_bytes_per_second")

// busyRetryAfter is the Retry-After of server_busy and too_many_in_flight,
// in seconds: uploads end within seconds, so a short wait usually finds
// room.
const busyRetryAfter = 1

// bodyMemory is the service-wide budget of request-body bytes held in
// memory. Taking never waits: an upload that finds too little left is
// refused (server_busy), since waiting would hold its connection and its
// sender's in-flight slot for nothing. Safe for concurrent use.
type bodyMemory struct {
	mu         sync.Mutex
	capacity   int64
	used, peak int64
}

func (m *bodyMemory) take(n int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used+n > m.capacity {
		return false
	}
	m.used += n
	m.peak = max(m.peak, m.used)
	return true
}

func (m *bodyMemory) give(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used -= n
}

// inUse returns the bytes held now and the most held at once so far.
func (m *bodyMemory) inUse() (used, peak int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used, m.peak
}

// Lease is one request's share of bodyMemory and of its user's in-flight
// slots, held by the handler's goroutine alone; Close gives both back.
type Lease struct {
	mem      *bodyMemory
	held     int64
	inFlight *inFlight // where user's slot is given back; nil: none
	user     string
}

// Need makes the lease hold at least n bytes, or refuses with server_busy.
func (l *Lease) Need(n int64) error {
	if n <= l.held {
		return nil
	}
	if !l.mem.take(n - l.held) {
		return ErrServerBusy.WithRetryAfter(busyRetryAfter)
	}
	l.held = n
	return nil
}

// Close gives the lease's memory and in-flight slot back.
func (l *Lease) Close() {
	l.mem.give(l.held)
	l.held = 0
	if l.inFlight != nil {
		l.inFlight.leave(l.user)
	}
}

// Held is how many bytes of body memory the lease holds.
func (l *Lease) Held() int64 { return l.held }

// NewLease is a lease on a body memory of its own of capacity bytes, in
// no user's in-flight slots: for a reader of bodies outside a request
// (tests, benchmarks). A request's lease comes from Edge.Enter.
func NewLease(capacity int64) *Lease { return &Lease{mem: &bodyMemory{capacity: capacity}} }

// inFlight counts each user's requests in progress. Safe for concurrent
// use.
type inFlight struct {
	mu  sync.Mutex
	max int
	n   map[string]int
}

func (f *inFlight) enter(user string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[user] >= f.max {
		return false
	}
	f.n[user]++
	return true
}

func (f *inFlight) leave(user string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[user]--; f.n[user] <= 0 {
		delete(f.n, user)
	}
}

// Enter takes one of the user's in-flight slots (429 too_many_in_flight
// when all are taken) and opens the request's body-memory lease. It runs
// after authentication and before the body is read; the lease's Close
// gives both back when the handler returns.
func (e *Edge) Enter(id keys.Identity) (*Lease, error) {
	if !e.inFlight.enter(id.UserID) {
		return nil, ErrTooManyInFlight.WithRetryAfter(busyRetryAfter)
	}
	return &Lease{mem: e.bodies, inFlight: e.inFlight, user: id.UserID}, nil
}

// BodyMemory returns the bytes of request bodies held now and the most
// held at once so far.
func (e *Edge) BodyMemory() (used, peak int64) { return e.bodies.inUse() }

// UsersInFlight is how many users have a request in progress.
func (e *Edge) UsersInFlight() int {
	e.inFlight.mu.Lock()
	defer e.inFlight.mu.Unlock()
	return len(e.inFlight.n)
}

// Arrivals makes a body of unknown length take memory from its lease as
// its bytes arrive, up to max: the multipart framing and headers around the
// image are held in memory too.
func Arrivals(r io.Reader, mem *Lease, max int64) io.Reader {
	return &arrivals{r: r, mem: mem, max: max}
}

type arrivals struct {
	r    io.Reader
	mem  *Lease
	max  int64
	seen int64
}

func (a *arrivals) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	a.seen += int64(n)
	if merr := a.mem.Need(min(a.seen, a.max)); merr != nil {
		return n, merr
	}
	return n, err
}

// BoundUploads is middleware for upload routes. It holds a request's body
// to the minimum upload rate, as a leaky bucket: from the first read the
// body may fall behind at most upload_grace, each
// byte earning 1/min_upload_bytes_per_second of time and the credit
// capped at upload_grace. So a stall longer than upload_grace is always
// cut off, however fast the bytes before it came, while an upload that
// keeps the rate on average never is. It is cut through the connection's
// read deadline (408 upload_too_slow, and the connection is closed); no
// deadline reaches past the server's read timeout. Once the body has
// ended the deadline is lifted, so that Go's server, which watches an idle
// connection for a hang-up while the handler runs, does not cancel a paid
// call in progress. It goes after LimitBody.
func (e *Edge) BoundUploads(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.ContentLength == 0 {
			return next(c)
		}
		return e.paced(c, next)
	}
}

// pacedBodies are pacedBody values for reuse: one is held by one request
// at a time, from paced's start until the body is put back.
var pacedBodies = sync.Pool{New: func() any { return new(pacedBody) }}

func (e *Edge) paced(c echo.Context, next echo.HandlerFunc) error {
	r := c.Request()
	b := pacedBodies.Get().(*pacedBody)
	*b = pacedBody{ReadCloser: r.Body, rc: *http.NewResponseController(c.Response()), now: e.wallClock,
		rate: e.cfg.MinUploadBytesPerSecond, grace: e.cfg.UploadGrace}
	// The body is put back before the answer goes out: Go's server
	// looks at its own type to judge whether the unread rest is worth
	// draining, and dontWaitForBody at LimitBody's. Nothing reads b
	// after the handler has returned, so it is reused then (after a
	// panic it is not).
	outer := r.Body
	r.Body = b
	err := next(c)
	r.Body = outer
	if b.slow {
		c.Response().Header().Set("Connection", "close")
	}
	*b = pacedBody{}
	pacedBodies.Put(b)
	return err
}

// pacedBody is a request body read under BoundUploads' deadlines.
type pacedBody struct {
	io.ReadCloser
	rc       http.ResponseController // a value: one allocation less per request
	now      func() time.Time
	rate     int64         // bytes per second
	grace    time.Duration // the most the body may fall behind
	end      time.Time     // the server's read timeout, from the first read: a refusal never reads the clock here
	deadline time.Time     // zero until the first read
	over     bool          // the body has ended: no more deadlines
	slow     bool          // a deadline passed
}

func (b *pacedBody) Read(p []byte) (int, error) {
	if b.over || b.slow {
		return b.ReadCloser.Read(p)
	}
	if b.deadline.IsZero() {
		now := b.now()
		b.deadline, b.end = now.Add(b.grace), now.Add(readTimeout)
		b.set()
	}
	n, err := b.ReadCloser.Read(p)
	if n > 0 && err != io.EOF { // the body's last bytes come with io.EOF: no deadline to move
		earned := time.Duration(n) * time.Second / time.Duration(b.rate)
		b.deadline = minTime(b.deadline.Add(earned), b.now().Add(b.grace))
		b.set()
	}
	switch {
	case err == io.EOF:
		b.over = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.slow = true
		return n, ErrReadTooSlow
	}
	return n, err
}

// set puts the deadline on the connection, never past the read timeout.
// A writer that cannot set deadlines (a test recorder) is not paced.
func (b *pacedBody) set() { _ = b.rc.SetReadDeadline(minTime(b.deadline, b.end)) }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
