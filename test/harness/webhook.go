package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Webhook is an alert receiver on 127.0.0.1 for a "json"
// [[alerts.webhook]]: it keeps every notice it is posted, in the order
// they arrive, whichever instance sent them.
type Webhook struct {
	URL string // what the webhook's url_env variable holds

	srv *http.Server

	mu      sync.Mutex
	notices []Notice
	arrived chan struct{} // closed and replaced at each notice
}

// Notice is what a webhook received of one alert.
type Notice struct {
	Kind    string            `json:"kind"`
	Details map[string]string `json:"details"`
}

// NewWebhook starts a receiver.
func NewWebhook() (*Webhook, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	w := &Webhook{URL: "http://" + ln.Addr().String() + "/hook", arrived: make(chan struct{})}
	w.srv = &http.Server{Handler: http.HandlerFunc(w.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = w.srv.Serve(ln) }()
	return w, nil
}

// WebhookConfig is the [alerts] section that posts every alert to a
// receiver whose URL is in the environment variable env, with no interval
// holding an alert back beyond the service's own once-per-period rules.
func WebhookConfig(env string) string {
	return fmt.Sprintf(`
[alerts]
min_interval = "1h"

[[alerts.webhook]]
format = "json"
url_env = %q
`, env)
}

func (w *Webhook) serve(rw http.ResponseWriter, r *http.Request) {
	var n Notice
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(body, &n) != nil || n.Kind == "" {
		http.Error(rw, "not a json notice", http.StatusBadRequest)
		return
	}
	w.mu.Lock()
	w.notices = append(w.notices, n)
	close(w.arrived)
	w.arrived = make(chan struct{})
	w.mu.Unlock()
	rw.WriteHeader(http.StatusNoContent)
}

// Kinds are the kinds received so far, in order of arrival.
func (w *Webhook) Kinds() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	kinds := make([]string, len(w.notices))
	for i, n := range w.notices {
		kinds[i] = n.Kind
	}
	return kinds
}

// Notices are the notices received so far, in order of arrival.
func (w *Webhook) Notices() []Notice {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.notices)
}

// WaitFor waits up to timeout for a notice of kind, and reports whether
// one has arrived.
func (w *Webhook) WaitFor(kind string, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		arrived := w.arrived
		w.mu.Unlock()
		if slices.Contains(w.Kinds(), kind) {
			return true
		}
		select {
		case <-arrived:
		case <-deadline.C:
			return false
		}
	}
}

// Close stops the receiver.
func (w *Webhook) Close() error { return w.srv.Close() }
