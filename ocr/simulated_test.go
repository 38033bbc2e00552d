package ocr

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestSimulatedRead(t *testing.T) {
	s, err := NewSimulated(Config{Provider: "simulated"})
	if err != nil {
		t.Fatal(err)
	}
	twos := 0
	for i := range 40 {
		img := Image{Data: []byte{byte(i), 'x'}, MIME: MIMEPNG, Width: 1000, Height: 500}
		res, err := s.Read(t.Context(), img, alwaysRetry)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		again, _ := s.Read(t.Context(), img, alwaysRetry)
		if got, want := fmtSerials(again), fmtSerials(res); got != want {
			t.Errorf("second read %s, want the same %s", got, want)
		}
		if n := len(res.Serials); n < 1 || n > 2 {
			t.Fatalf("got %d serials, want 1 or 2", n)
		} else if n == 2 {
			twos++
		}
		for _, v := range res.Serials {
			if !s.pattern.MatchString(v) || len(v) != len("SIM-")+8 || v[:4] != "SIM-" {
				t.Errorf("serial %q, want SIM- and 8 hex digits matching the default pattern", v)
			}
		}
		if len(res.Rejected) != 0 || !res.Simulated || res.Model != DefaultModel {
			t.Errorf("Result = %+v", res)
		}
		// DefaultModel counts media_resolution "high": 1120 tokens.
		if got, want := res.Usage, (Usage{PromptTokens: 1120 + 40, CandidatesTokens: 12}); got != want {
			t.Errorf("Usage = %+v, want %+v", got, want)
		}
	}
	if twos == 0 || twos == 40 {
		t.Errorf("%d of 40 images gave two serials, want some", twos)
	}

	// A Gemini 2.x model counts the 1000×500 image's two 768-px tiles.
	s, err = NewSimulated(Config{Provider: "simulated", Model: "gemini-2.5-flash"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Read(t.Context(), Image{Data: []byte("x"), MIME: MIMEPNG, Width: 1000, Height: 500}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Usage, (Usage{PromptTokens: 2*258 + 40, CandidatesTokens: 12}); got != want {
		t.Errorf("gemini-2.5-flash: Usage = %+v, want %+v", got, want)
	}
}

func fmtSerials(r Result) string {
	s := ""
	for _, v := range r.Serials {
		s += v + " "
	}
	return s
}

func TestSimulatedCustomPattern(t *testing.T) {
	s, err := NewSimulated(Config{SerialPattern: `[0-9]+`})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Read(t.Context(), Image{Data: []byte("a"), Width: 1, Height: 1}, alwaysRetry)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Serials) != 0 || len(res.Rejected) == 0 {
		t.Errorf("Serials %q, Rejected %q; want every SIM- value rejected", res.Serials, res.Rejected)
	}
}

func TestSimulatedLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := NewSimulated(Config{SimulatedLatency: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		img := Image{Data: []byte("label"), Width: 10, Height: 10}

		start := time.Now()
		if _, err := s.Read(t.Context(), img, alwaysRetry); err != nil {
			t.Fatalf("Read: %v", err)
		}
		if got := time.Since(start); got != 2*time.Second {
			t.Errorf("Read took %v, want 2s", got)
		}

		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		start = time.Now()
		_, err = s.Read(ctx, img, alwaysRetry)
		var ue *UpstreamError
		if !errors.As(err, &ue) || ue.Reason != ReasonTimeout {
			t.Errorf("Read with a short deadline = %v, want Reason timeout", err)
		}
		if got := time.Since(start); got != 500*time.Millisecond {
			t.Errorf("Read gave up after %v, want 500ms", got)
		}

		ctx, cancel = context.WithCancel(t.Context())
		cancel()
		_, err = s.Read(ctx, img, alwaysRetry)
		if !errors.As(err, &ue) || ue.Reason != ReasonCanceled {
			t.Errorf("Read with a canceled ctx = %v, want Reason canceled", err)
		}
	})
}

func TestNewSimulatedInvalid(t *testing.T) {
	if _, err := NewSimulated(Config{SimulatedLatency: -time.Second}); err == nil {
		t.Error("NewSimulated with negative latency: err = nil")
	}
}
