package api

import (
	"bytes"
	"io"
	"mime"
	"net/http"
	"testing"
	"testing/iotest"
	"time"

	"breakwater/limiter"
	"breakwater/server/edge"
)

// deadlineWriter is a discardWriter that takes read deadlines, as Go's
// server's writer does, and keeps them.
type deadlineWriter struct {
	discardWriter
	deadlines []time.Time
}

func (w *deadlineWriter) SetReadDeadline(d time.Time) error {
	w.deadlines = append(w.deadlines, d)
	return nil
}

// TestPacedUploadDeadlines: an upload that arrives in one read sets the
// connection's read deadline once at its first read and lifts it at its
// end; its last bytes, which come with io.EOF, move no deadline (each is
// a timer's reset in Go's poller: once three per read, one wasted).
func TestPacedUploadDeadlines(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := pngBytes(t, 64, 32)
	req, _ := refusalRequest(img)
	req.Body = io.NopCloser(iotest.DataErrReader(bytes.NewReader(img))) // as Go's server's body: io.EOF with the last bytes
	req.Header["Authorization"] = []string{"Bearer " + e.key}
	w := &deadlineWriter{discardWriter: discardWriter{h: http.Header{}}}
	e.srv.Handler().ServeHTTP(w, req)
	if w.status != http.StatusOK {
		t.Fatalf("status %d, want 200", w.status)
	}
	if got, want := len(w.deadlines), 2; got != want {
		t.Fatalf("%d read deadlines set (%v), want %d: one at the first read, one lifted at the end", got, w.deadlines, want)
	}
	if w.deadlines[0].IsZero() || !w.deadlines[1].IsZero() {
		t.Errorf("deadlines %v, want a deadline and then none", w.deadlines)
	}
}

// TestReadImageAllocations: a plain upload of a declared length is read
// into its one buffer; its Content-Type is not parsed as a form's (which
// took another allocation).
func TestReadImageAllocations(t *testing.T) {
	img := pngBytes(t, 64, 32)
	req, body := refusalRequest(img)
	req.Body = io.NopCloser(iotest.DataErrReader(body)) // as Go's server's body: io.EOF with the last bytes
	mem := edge.NewLease(1 << 30)
	allocs := testing.AllocsPerRun(100, func() {
		body.Reset(img)
		mem.Close()
		if _, _, err := readImage(req, 1<<20, edge.DefaultMaxMultipartParts, mem); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("%v allocations per upload, want at most 1", allocs)
	}
}

// TestMaybeForm: whatever mime.ParseMediaType reads as a form, maybeForm
// lets through to it.
func TestMaybeForm(t *testing.T) {
	for _, tc := range []struct {
		ct   string
		want bool
	}{
		{"image/png", false},
		{"", false},
		{"application/octet-stream", false},
		{"multipart/mixed; boundary=x", false},
		{"multipart/form-data; boundary=x", true},
		{"  Multipart/Form-Data ;boundary=x", true},
		{"MULTIPART/FORM-DATA", true},
		{"multİpart/form-data; boundary=x", true}, // İ lower-cases to i
		{"image/png; x=\"multipart/form-data\"", true},
	} {
		t.Run(tc.ct, func(t *testing.T) {
			if got := maybeForm(tc.ct); got != tc.want {
				t.Errorf("maybeForm(%q) = %v, want %v", tc.ct, got, tc.want)
			}
			if mt, _, _ := mime.ParseMediaType(tc.ct); mt == formType && !maybeForm(tc.ct) {
				t.Errorf("mime reads %q as a form, maybeForm does not", tc.ct)
			}
		})
	}
}

// FuzzMaybeForm: maybeForm is false only for what mime does not read as
// a form.
func FuzzMaybeForm(f *testing.F) {
	for _, ct := range []string{"image/png", "multipart/form-data; boundary=x", " MULTIPART/form-DATA", "multİpart/form-data"} {
		f.Add(ct)
	}
	f.Fuzz(func(t *testing.T, ct string) {
		if mt, _, _ := mime.ParseMediaType(ct); mt == formType && !maybeForm(ct) {
			t.Errorf("mime reads %q as a form, maybeForm does not", ct)
		}
	})
}

// TestRecordContexts: the reads recorded within one epoch share a
// context, whose deadline is recordTimeout after the first of them; the
// next epoch has its own.
func TestRecordContexts(t *testing.T) {
	start := time.Now()
	now := start
	r := &recordContexts{now: func() time.Time { return now }}
	first := r.get()
	if d, ok := first.Deadline(); !ok || !d.Equal(start.Add(recordTimeout)) {
		t.Fatalf("deadline %v (%v), want %v", d, ok, start.Add(recordTimeout))
	}
	now = start.Add(recordEpoch - time.Nanosecond)
	if r.get() != first {
		t.Error("a read within the epoch has a context of its own, want the epoch's")
	}
	now = start.Add(recordEpoch)
	next := r.get()
	if next == first {
		t.Fatal("a read after the epoch has the old context, want a new one")
	}
	if d, _ := next.Deadline(); !d.Equal(now.Add(recordTimeout)) {
		t.Errorf("deadline %v, want %v", d, now.Add(recordTimeout))
	}
	if first.Err() != nil || next.Err() != nil {
		t.Errorf("errors %v, %v before their deadlines, want none", first.Err(), next.Err())
	}
}

// TestRecordContextPerEpoch: accepted reads one after another within an
// epoch make no context of their own (a context, a timer and its cancel
// were three allocations and a tenth of the handler's CPU).
func TestRecordContextPerEpoch(t *testing.T) {
	e := newEnv(t, envOptions{limits: limiter.Config{Rate: 1000, Window: time.Second}})
	img := pngBytes(t, 64, 32)
	req, body := refusalRequest(img)
	req.Header["Authorization"] = []string{"Bearer " + e.key}
	w := &discardWriter{h: http.Header{}}
	var seen []*recordContext
	for i := range 3 {
		w.reset()
		body.Reset(bytes.Clone(img))
		e.srv.Handler().ServeHTTP(w, req)
		if w.status != http.StatusOK {
			t.Fatalf("read %d: status %d, want 200", i, w.status)
		}
		seen = append(seen, e.srv.recordCtx.cur.Load())
	}
	if seen[0] == nil || seen[1] != seen[0] || seen[2] != seen[0] {
		t.Errorf("record contexts %v, want one shared by the three reads", seen)
	}
}
