package detect

import "testing"

func TestEventCount(t *testing.T) {
	for _, tt := range []struct {
		count, want int64
	}{{0, 1}, {1, 1}, {7, 7}, {-3, 1}} {
		if got := (Event{Count: tt.count}).N(); got != tt.want {
			t.Errorf("Event{Count: %d}.N() = %d, want %d", tt.count, got, tt.want)
		}
	}
}
