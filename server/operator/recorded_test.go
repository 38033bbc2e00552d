package operator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"breakwater/detect"
)

var t0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// frames is an answer of GET /api/recorded with n events, one finding
// and the end, and the offsets where each frame ends.
func frames(n int) (string, []int) {
	var b bytes.Buffer
	bw := bufio.NewWriter(&b)
	w := NewRecordedWriter(bw)
	var ends []int
	mark := func() { bw.Flush(); ends = append(ends, b.Len()) }
	for i := range n {
		w.Event(detect.Event{Time: t0.Add(time.Duration(i)), UserID: "alice", Route: "/v1/ocr", Outcome: "ok", Count: int64(i), CostMicroUSD: -1})
		mark()
	}
	w.Finding(detect.Finding{Day: "2026-11-20", Detector: "rate", Subject: "alice"})
	mark()
	w.End()
	mark()
	return b.String(), ends
}

// serve answers every call with status, content type and body.
func serve(t *testing.T, status int, ctype, body string) *AdminClient {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return NewAdminClient(strings.TrimPrefix(srv.URL, "http://"), "token")
}

// The events are handed over one at a time as they are read; an answer
// cut short, malformed, miscounted or stopped by the server is an error
// that says so, never a partial result.
func TestRecordedStream(t *testing.T) {
	whole, ends := frames(3)
	failed := func() string {
		var b bytes.Buffer
		bw := bufio.NewWriter(&b)
		w := NewRecordedWriter(bw)
		w.Event(detect.Event{Time: t0, UserID: "alice"})
		w.Event(detect.Event{Time: t0, UserID: "alice"})
		w.Fail("reading the statistics failed")
		return b.String()
	}()
	miscounted := []byte(whole)
	miscounted[len(miscounted)-2] = 4 // the end frame counts 4 events
	cases := []struct {
		name, body string
		want       string // "" for no error
	}{
		{"whole", whole, ""},
		{"cut after an event", whole[:ends[2]], "ended without its end frame"},
		{"cut within a frame", whole[:ends[1]-3], "not what the API sends"},
		{"no end frame", whole[:ends[3]], "ended without its end frame"},
		{"miscounted", string(miscounted), "counts 4 events and 1 findings, 3 and 1 came"},
		{"not frames", "<html>proxy error</html>", "not what the API sends"},
		{"after the end", whole + "e\x00", "more follows the end frame"},
		{"stopped by the server", failed, "the server stopped after 2 events: reading the statistics failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := serve(t, http.StatusOK, RecordedContentType, tc.body)
			var got []detect.Event
			findings, err := a.EachRecorded(context.Background(), t0, t0.Add(time.Hour), func(e detect.Event) error {
				got = append(got, e)
				return nil
			})
			if tc.want == "" {
				if err != nil || len(got) != 3 || len(findings) != 1 || findings[0].Subject != "alice" {
					t.Fatalf("%d events, findings %v, err %v; want 3 and alice's", len(got), findings, err)
				}
				want := detect.Event{Time: t0.Add(2), UserID: "alice", Route: "/v1/ocr", Outcome: "ok", Count: 2, CostMicroUSD: -1}
				if got[2] != want {
					t.Errorf("event %+v, want %+v", got[2], want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
			if findings != nil {
				t.Errorf("findings %v with an error", findings)
			}
		})
	}
	t.Run("another version", func(t *testing.T) {
		a := serve(t, http.StatusOK, "application/json", `{"events":[],"findings":[]}`)
		_, err := a.EachRecorded(context.Background(), t0, t0.Add(time.Hour), func(detect.Event) error { return nil })
		if !errors.Is(err, ErrCutShort) || !strings.Contains(err.Error(), "another version") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("fn stops it", func(t *testing.T) {
		stop := errors.New("enough")
		a := serve(t, http.StatusOK, RecordedContentType, whole)
		_, err := a.EachRecorded(context.Background(), t0, t0.Add(time.Hour), func(detect.Event) error { return stop })
		if !errors.Is(err, stop) {
			t.Fatalf("err %v, want fn's", err)
		}
	})
}

// An answer larger than any fixed cap is read whole (it was cut at
// 16 MiB: "unexpected end of JSON input"); one cut short says so.
func TestAnswersOfAnySize(t *testing.T) {
	list := make([]UsageInfo, 120_000)
	for i := range list {
		list[i] = UsageInfo{User: fmt.Sprintf("user-%06d-with-a-longer-name-to-weigh", i), Plan: "free"}
	}
	body, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) <= 16<<20 {
		t.Fatalf("the answer is %d bytes, want more than 16 MiB", len(body))
	}
	got, err := serve(t, http.StatusOK, "application/json", string(body)).Usage(context.Background(), "")
	if err != nil || len(got) != len(list) || got[len(got)-1].User != list[len(list)-1].User {
		t.Fatalf("%d users, err %v; want %d", len(got), err, len(list))
	}
	_, err = serve(t, http.StatusOK, "application/json", string(body[:len(body)-100])).Usage(context.Background(), "")
	if !errors.Is(err, ErrCutShort) {
		t.Fatalf("err %v on a cut answer, want ErrCutShort", err)
	}
}

// Whatever bytes an answer holds, reading it never panics: it ends in an
// error that says the answer was cut short (or that the server stopped),
// or in events and findings that a writer writes again into an answer
// that reads.
func FuzzReadRecorded(f *testing.F) {
	whole, ends := frames(3)
	f.Add([]byte(whole))
	f.Add([]byte(whole[:ends[1]]))
	f.Add([]byte("e\x05\x00\x00\x00\x00\x00"))
	f.Add([]byte("z\x02\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got []detect.Event
		findings, err := readRecorded(bytes.NewReader(b), "fuzz", func(e detect.Event) error {
			got = append(got, e)
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrCutShort) && !strings.Contains(err.Error(), "the server stopped") {
				t.Fatalf("error %v is neither a cut answer nor the server's", err)
			}
			return
		}
		var again bytes.Buffer
		bw := bufio.NewWriter(&again)
		w := NewRecordedWriter(bw)
		for _, e := range got {
			w.Event(e)
		}
		for _, fd := range findings {
			w.Finding(fd)
		}
		w.End()
		if _, err := readRecorded(bytes.NewReader(again.Bytes()), "fuzz", func(detect.Event) error { return nil }); err != nil {
			t.Fatalf("the answer written again does not read: %v", err)
		}
	})
}

// A server that stops sending in the middle of the answer is given up
// on once nothing came for the idle time, with an error that says so
// (on synctest's clock: the answer comes through a pipe that the request's
// context closes, as Go's transport does).
func TestRecordedStalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		whole, ends := frames(3)
		a := NewAdminClient("192.0.2.1:8081", "token")
		a.hc = &http.Client{Transport: roundTrip(func(req *http.Request) (*http.Response, error) {
			pr, pw := io.Pipe()
			go func() {
				pw.Write([]byte(whole[:ends[1]])) // two events, then nothing
				<-req.Context().Done()
				pw.CloseWithError(req.Context().Err())
			}()
			h := http.Header{"Content-Type": {RecordedContentType}}
			return &http.Response{StatusCode: http.StatusOK, Header: h, Body: pr, Request: req}, nil
		})}
		start := time.Now()
		var got int
		_, err := a.EachRecorded(context.Background(), t0, t0.Add(time.Hour), func(detect.Event) error { got++; return nil })
		if !errors.Is(err, ErrCutShort) || !strings.Contains(err.Error(), "nothing came for 1m0s") || got != 2 {
			t.Fatalf("err %v after %d events, want the stall said after 2", err, got)
		}
		if waited := time.Since(start); waited != streamIdle {
			t.Errorf("given up after %s, want %s", waited, streamIdle)
		}
	})
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
