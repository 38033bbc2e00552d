package storage

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"breakwater/detect"
)

// A read-only open writes nothing to the file, not even at open, reads
// the events, refuses writes, and cannot share the file with a server.
func TestReadOnlyWritesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bw.db")
	db, err := Open(path, Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	if err := db.AppendEvents([]detect.Event{{Time: at, UserID: "u", Route: "/v1/ocr", Outcome: "ok"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{Logger: quietLogger, ReadOnly: true, Timeout: 50 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		t.Errorf("read-only open beside a server: %v, want ErrLocked", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	ro, err := Open(path, Options{Logger: quietLogger, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	events, err := ro.Events(time.Time{}, time.Time{})
	if err != nil || len(events) != 1 {
		t.Errorf("events %v, %v; want the one stored", events, err)
	}
	if err := ro.AppendEvents([]detect.Event{{Time: at, UserID: "v"}}); err == nil {
		t.Error("a read-only database took a write")
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("the read-only open changed the file")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none.db"), Options{Logger: quietLogger, ReadOnly: true}); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("read-only open of no file: %v, want ErrNoDatabase", err)
	}
}
