package harness

import (
	"bytes"
	"image/png"
	"testing"
)

// TestListeningWaitsForEveryListener: Start's check takes a server as up
// only once each listener it opens has logged its address.
func TestListeningWaitsForEveryListener(t *testing.T) {
	const (
		start    = `time=T level=INFO msg="starting breakwater" storage=/x listen=127.0.0.1:0 admin_listen=127.0.0.1:0 layers="rate 60/1m0s"` + "\n"
		startOff = `time=T level=INFO msg="starting breakwater" storage=/x listen=127.0.0.1:0 admin_listen="off (BREAKWATER_ADMIN_TOKEN unset)" layers="rate"` + "\n"
		public   = "time=T level=INFO msg=listening listener=public addr=127.0.0.1:4001\n"
		admin    = "time=T level=INFO msg=listening listener=admin addr=127.0.0.1:4002\n"
	)
	tests := []struct {
		name, log string
		want      bool
	}{
		{"nothing yet", "", false},
		{"started, no listener", start, false},
		{"public only, admin on", start + public, false},
		{"both", start + public + admin, true},
		{"admin off, public", startOff + public, true},
		{"admin off, nothing yet", startOff, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, ok := listening([]byte(tt.log))
			if ok != tt.want {
				t.Fatalf("listening = %v, want %v", ok, tt.want)
			}
			if ok && addr != "127.0.0.1:4001" {
				t.Errorf("address %q, want the public one", addr)
			}
		})
	}
}

// TestNthPNGDistinct: each n gives another valid image, and PNG is the
// first of them.
func TestNthPNGDistinct(t *testing.T) {
	seen := map[string]uint64{}
	for _, n := range []uint64{0, 1, 2, 3, 255, 1 << 40, 1<<64 - 1} {
		b := NthPNG(n)
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Fatalf("NthPNG(%d): %v", n, err)
		}
		if m, dup := seen[string(b)]; dup {
			t.Fatalf("NthPNG(%d) is NthPNG(%d)", n, m)
		}
		seen[string(b)] = n
	}
	if !bytes.Equal(PNG(), NthPNG(0)) {
		t.Error("PNG() is not NthPNG(0)")
	}
}
