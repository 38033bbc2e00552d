package storage

import (
	"errors"
	"testing"
)

// LastDetectRun on a new file is ErrNotFound to storage's own callers
// (detect.ErrNoRun as well: the suite's Detection checks that).
func TestLastDetectRunNotFound(t *testing.T) {
	db := mustOpen(t)
	if _, err := db.LastDetectRun(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("LastDetectRun on a new database = %v, want ErrNotFound", err)
	}
}
