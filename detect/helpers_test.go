package detect

import (
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newTestLogger(w io.Writer, mu *sync.Mutex) *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{w: w, mu: mu}, nil))
}

func splitAddr(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	return host, port
}

// waitSent waits until the mailer has counted n messages sent: the SMTP
// server holds a message a moment before the mailer hears back.
func waitSent(t *testing.T, counters *Counters, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); counters.AlertsSent.Load() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("sent counter %d, want %d", counters.AlertsSent.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
