package main

// The load generator: a small HTTP/1.1 client over keep-alive TCP
// connections, in the spirit of wrk. Each client is one goroutine with one
// connection; it writes a request, reads the whole response, and goes on.
// Requests are raw bytes built by the case, so a request costs the
// generator a write and a parse, not net/http's client machinery: on two
// cores shared with the server, a heavy client would take CPU from the
// server and flatten every ratio.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// load describes one run of the generator.
type load struct {
	addr    string // host:port, always on loopback
	clients int    // concurrent connections, one request in flight each
	// Either a fixed duration after a warm-up (answers that arrive during
	// the warm-up are not counted)...
	warmup, duration time.Duration
	// ...or a fixed number of requests (total > 0), each sent once.
	total int64
	// timeout bounds one request; a request that takes longer is an error
	// and its connection is closed.
	timeout time.Duration
	// request appends the bytes of request number seq (counted across all
	// clients from 0) to buf. It is called on the client's goroutine and
	// must be safe for concurrent use; scratch is the client's own.
	request func(buf []byte, seq int64, scratch *clientScratch) []byte
	// onRequest, if set, is called with +1 when a request is written and
	// -1 when its answer is read (or it failed).
	onRequest func(delta int)
	// pace, if set, is each client's interval between the starts of its
	// requests: clients × 1/pace requests per second in all, as long as
	// answers come faster than pace. A client that falls behind starts
	// its next request at once, without catching up.
	pace time.Duration
}

// clientScratch is per-client state a request builder may use.
type clientScratch struct {
	id   int
	rand uint64 // a xorshift state, seeded per client
}

// next returns a pseudo-random number (xorshift64*), cheap enough to draw
// per request byte.
func (s *clientScratch) next() uint64 {
	s.rand ^= s.rand >> 12
	s.rand ^= s.rand << 25
	s.rand ^= s.rand >> 27
	return s.rand * 2685821657736338717
}

// outcome is what a run measured.
type outcome struct {
	requests  int64           // answers counted (inside the measured time)
	elapsed   time.Duration   // the measured time
	latencies []time.Duration // of the counted answers, sorted
	statuses  map[int]int64   // status code -> answers counted
	errors    int64           // connection or protocol errors (not counted as answers)
	firstErr  error
}

// rps is the answers per second.
func (o outcome) rps() float64 {
	if o.elapsed <= 0 {
		return 0
	}
	return float64(o.requests) / o.elapsed.Seconds()
}

// percentile returns the latency below which a share p (0..1) of the
// counted answers fall.
func (o outcome) percentile(p float64) time.Duration {
	if len(o.latencies) == 0 {
		return 0
	}
	i := int(p*float64(len(o.latencies))+0.5) - 1
	return o.latencies[min(max(i, 0), len(o.latencies)-1)]
}

// share returns the fraction of counted answers with the given status.
func (o outcome) share(status int) float64 {
	if o.requests == 0 {
		return 0
	}
	return float64(o.statuses[status]) / float64(o.requests)
}

// clientResult is one client's tally, merged into an outcome at the end.
type clientResult struct {
	latencies []time.Duration
	statuses  map[int]int64
	errors    int64
	firstErr  error
}

// generate runs l and returns what it measured.
func generate(l load) outcome {
	if l.timeout == 0 {
		l.timeout = 10 * time.Second
	}
	start := time.Now()
	measureFrom := start.Add(l.warmup)
	end := measureFrom.Add(l.duration)
	var seq atomic.Int64
	results := make([]clientResult, l.clients)
	var wg sync.WaitGroup
	for i := range l.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runClient(l, i, &seq, measureFrom, end)
		}()
	}
	wg.Wait()
	finished := time.Now()

	o := outcome{statuses: map[int]int64{}, elapsed: l.duration}
	if l.total > 0 {
		o.elapsed = finished.Sub(start)
	}
	for _, r := range results {
		o.latencies = append(o.latencies, r.latencies...)
		for s, n := range r.statuses {
			o.statuses[s] += n
		}
		o.errors += r.errors
		if o.firstErr == nil {
			o.firstErr = r.firstErr
		}
	}
	o.requests = int64(len(o.latencies))
	slices.Sort(o.latencies)
	return o
}

// runClient is one client: one connection at a time, one request at a time,
// until the end of the run (or until the requests are used up).
func runClient(l load, id int, seq *atomic.Int64, measureFrom, end time.Time) clientResult {
	res := clientResult{statuses: map[int]int64{}}
	scratch := &clientScratch{id: id, rand: uint64(id)*0x9E3779B97F4A7C15 + 1}
	var conn net.Conn
	var br *bufio.Reader
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	fail := func(err error) {
		res.errors++
		if res.firstErr == nil {
			res.firstErr = err
		}
		if conn != nil {
			conn.Close()
			conn = nil
		}
	}
	var buf []byte
	next := time.Now().Add(time.Duration(id) * l.pace / time.Duration(max(l.clients, 1))) // spread the clients' starts
	for {
		if l.pace > 0 {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = later(next, time.Now()).Add(l.pace)
		}
		var n int64
		if l.total > 0 {
			if n = seq.Add(1) - 1; n >= l.total {
				return res
			}
		} else {
			n = seq.Add(1) - 1
		}
		t0 := time.Now()
		if l.total == 0 && !t0.Before(end) {
			return res
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", l.addr, l.timeout)
			if err != nil {
				fail(err)
				if l.total > 0 {
					return res // a fixed request is not retried: it counts as an error
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			conn, br = c, bufio.NewReaderSize(c, 16<<10)
		}
		buf = l.request(buf[:0], n, scratch)
		if err := conn.SetDeadline(t0.Add(l.timeout)); err != nil {
			fail(err)
			continue
		}
		if l.onRequest != nil {
			l.onRequest(+1)
		}
		status, keepAlive, err := roundTrip(conn, br, buf)
		if l.onRequest != nil {
			l.onRequest(-1)
		}
		t1 := time.Now()
		if err != nil {
			fail(err)
			continue
		}
		// Counted by when the answer came: in a steady state that is the
		// throughput, with no bias at the edges of the measured time.
		if l.total > 0 || (!t1.Before(measureFrom) && !t1.After(end)) {
			res.latencies = append(res.latencies, t1.Sub(t0))
			res.statuses[status]++
		}
		if !keepAlive {
			conn.Close()
			conn = nil
		}
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

var errBadResponse = errors.New("loadgen: malformed HTTP response")

// roundTrip writes req and reads one whole response, returning its status
// and whether the connection may be used again.
func roundTrip(conn net.Conn, br *bufio.Reader, req []byte) (status int, keepAlive bool, err error) {
	if _, err := conn.Write(req); err != nil {
		return 0, false, err
	}
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, fmt.Errorf("%w: status line %q", errBadResponse, line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("%w: status line %q", errBadResponse, line)
	}
	keepAlive = line[7] == '1' // HTTP/1.1 keeps the connection unless told otherwise
	length, chunked := -1, false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) <= 2 { // the empty line ending the header
			break
		}
		name, value, ok := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("%w: header line %q", errBadResponse, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, false, fmt.Errorf("%w: Content-Length %q", errBadResponse, value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			keepAlive = !bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		err = discardChunked(br)
	case length >= 0:
		_, err = br.Discard(length)
	default: // the body runs to the end of the connection
		_, err = io.Copy(io.Discard, br)
		keepAlive = false
	}
	return status, keepAlive, err
}

// discardChunked reads a chunked body and its trailer.
func discardChunked(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		sizeText, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		size, err := strconv.ParseInt(string(bytes.TrimSpace(sizeText)), 16, 64)
		if err != nil {
			return fmt.Errorf("%w: chunk size %q", errBadResponse, line)
		}
		if size == 0 {
			for { // trailer lines, then the empty line
				line, err = br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(line) <= 2 {
					return nil
				}
			}
		}
		if _, err := br.Discard(int(size) + 2); err != nil {
			return err
		}
	}
}
