package netcut

import (
	"net"
	"sync"
	"testing"
	"time"
)

// delayRelay is a TCP relay that holds every chunk of bytes for oneWay
// before passing it on, in both directions, in order: a link with
// 2×oneWay more round-trip time. It stands for tc's netem delay, which
// this kernel lacks (CONFIG_NET_SCH_NETEM is not set, and it loads no
// modules); docs/INSTANCES.md says so where it gives the figures.
type delayRelay struct {
	ln     net.Listener
	target string
	oneWay time.Duration

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// newDelayRelay listens on listen (host:port) and relays to target; it
// is closed when t ends.
func newDelayRelay(t *testing.T, listen, target string, oneWay time.Duration) *delayRelay {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	r := &delayRelay{ln: ln, target: target, oneWay: oneWay}
	r.wg.Go(r.accept)
	t.Cleanup(r.close)
	return r
}

// Addr is where the relay listens.
func (r *delayRelay) Addr() string { return r.ln.Addr().String() }

func (r *delayRelay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		d, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, d)
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(c, d) })
		r.wg.Go(func() { r.pipe(d, c) })
	}
}

// chunk is bytes read at a moment, to be written oneWay later.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, each chunk oneWay after it was read.
func (r *delayRelay) pipe(src, dst net.Conn) {
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{b: buf[:n], at: time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at.Add(r.oneWay)))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	// The source ended (or the destination failed): end both ways.
	src.Close()
	dst.Close()
	for range ch { // let the reader end
	}
}

func (r *delayRelay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
