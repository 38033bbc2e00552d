package detect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOutboxCountsByItsSpec drives one outbox of each shape, the Mailer's
// (drops and give-ups counted as failures) and a Webhook's (drops and
// give-ups counted apart), through the same items: one taken, one refused
// for good, one failing until Close cuts its hour-long wait short, and
// one pushed after Close. The counts come out the same whatever the timing.
func TestOutboxCountsByItsSpec(t *testing.T) {
	for _, shape := range []string{"mail", "webhook"} {
		t.Run(shape, func(t *testing.T) {
			var sent, failed, dropped atomic.Uint64
			var callsMu sync.Mutex
			calls := map[string]int{} // item → tries
			var logs bytes.Buffer
			var mu sync.Mutex
			spec := outboxSpec[string]{
				send: func(item string) error {
					callsMu.Lock()
					calls[item]++
					callsMu.Unlock()
					switch item {
					case "ok":
						return nil
					case "refused":
						return fmt.Errorf("%w: 403", errPermanent)
					}
					return errors.New("503")
				},
				attempts: 3, base: time.Hour, max: time.Hour,
				log:   newTestLogger(&logs, &mu),
				attrs: func(item string) []any { return []any{"item", item} },
				text:  outboxText{dropped: "DROPPED", sent: "SENT", retry: "RETRY", givenUp: "GIVEN-UP", shutdown: "AT-SHUTDOWN"},
				sent:  &sent, failed: &failed, dropped: &dropped,
			}
			if shape == "webhook" {
				spec.givenUp = &dropped
			} else {
				spec.dropped = &failed
			}
			o := newOutbox(spec)
			for _, item := range []string{"refused", "ok", "flaky"} {
				if !o.Push(item) {
					t.Fatalf("%s not queued", item)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := o.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if o.Push("late") {
				t.Fatal("an item pushed after Close was queued")
			}

			callsMu.Lock()
			for item, want := range map[string]int{"refused": 1, "ok": 1, "flaky": 2} {
				if calls[item] != want {
					t.Errorf("%s tried %d times, want %d", item, calls[item], want)
				}
			}
			callsMu.Unlock()
			wantFailed, wantDropped := uint64(3), uint64(3) // webhook: refused, flaky and late dropped
			if shape == "mail" {
				wantFailed, wantDropped = 4, 0 // the late drop is a failure
			}
			if sent.Load() != 1 || failed.Load() != wantFailed || dropped.Load() != wantDropped {
				t.Errorf("sent %d failed %d dropped %d, want 1 %d %d", sent.Load(), failed.Load(), dropped.Load(), wantFailed, wantDropped)
			}
			mu.Lock()
			text := logs.String()
			mu.Unlock()
			for _, line := range []string{
				"msg=GIVEN-UP item=refused attempts=1", "msg=SENT item=ok attempt=1",
				"msg=RETRY item=flaky attempt=1 retry_in=1h0m0s", "msg=AT-SHUTDOWN item=flaky err=503",
				"msg=DROPPED item=late",
			} {
				if !strings.Contains(text, line) {
					t.Errorf("no %q in the log:\n%s", line, text)
				}
			}
		})
	}
}

// TestOutboxCloseEndsWithItsContext shows that Close waits no longer than
// its ctx for a delivery that hangs.
func TestOutboxCloseEndsWithItsContext(t *testing.T) {
	release := make(chan struct{})
	var sent, failed atomic.Uint64
	var logs bytes.Buffer
	var mu sync.Mutex
	o := newOutbox(outboxSpec[string]{
		send:  func(string) error { <-release; return nil },
		log:   newTestLogger(&logs, &mu),
		attrs: func(string) []any { return nil },
		sent:  &sent, failed: &failed, dropped: &failed,
	})
	o.Push("stuck")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := o.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want the context's deadline", err)
	}
	close(release)
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if sent.Load() != 1 || failed.Load() != 0 {
		t.Errorf("sent %d failed %d, want 1 0", sent.Load(), failed.Load())
	}
}
