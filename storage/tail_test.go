package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"breakwater/budget"
)

// dataEnd is the database's high-water mark: the bytes bbolt's pages take.
func dataEnd(t *testing.T, db *DB) int64 {
	t.Helper()
	var end int64
	if err := db.bolt.View(func(tx *bbolt.Tx) error { end = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return end
}

// firstHole is where the file's first hole at or past off begins (its
// size when it has none: the end of a file counts as a hole).
func firstHole(t *testing.T, path string, off int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hole, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		t.Fatal(err)
	}
	return hole
}

// TestTailWrittenAhead grows a database through group commit and checks
// that past its data the file has no hole for at least tailChunk bytes, at
// every step: bbolt's page writes land on blocks already written. Then the
// file is reopened, checked page by page, and holds every row.
func TestTailWrittenAhead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breakwater.db")
	db, err := Open(path, Options{Logger: quietLogger, NoSync: true}) // the file's growth is the same without fsyncs
	if err != nil {
		t.Fatal(err)
	}
	const steps, perStep = 6, 2000 // about 0.4 MiB of usage rows a step: the tail is written anew several times
	for step := range steps {
		for i := range perStep {
			at := t0.Add(time.Duration(step*perStep+i) * time.Millisecond)
			if err := db.RecordUsage(t.Context(), month, usageAt(fmt.Sprintf("u%d", i%7), at), budget.Settlement{}); err != nil {
				t.Fatal(err)
			}
		}
		end := dataEnd(t, db)
		if hole := firstHole(t, path, end); hole < end+tailChunk {
			t.Fatalf("step %d: the data ends at %d and the first hole past it is at %d: fewer than %d bytes written ahead", step, end, hole, tailChunk)
		}
		if info, err := os.Stat(path); err != nil || info.Size() > end+2*tailChunk+16<<20 {
			t.Fatalf("step %d: the file is %d bytes for %d of data (%v): the tail runs too far ahead", step, info.Size(), end, err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = Open(path, Options{Logger: quietLogger, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	recs, err := db.Usage(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != steps*perStep {
		t.Fatalf("%d usage rows after reopening, want %d", len(recs), steps*perStep)
	}
}

// TestTailFailureWaits: a tail that cannot be written (its file read
// only here, as a full disk would fail it) returns the error, leaves the
// transaction to commit, and is not tried again for tailRetryAfter
// transactions; then it is.
func TestTailFailureWaits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breakwater.db")
	db, err := Open(path, Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tl := &tail{}
	if tl.f, err = os.Open(path); err != nil { // read only: every write fails
		t.Fatal(err)
	}
	defer tl.close()
	extend := func() error {
		var extendErr error
		if err := db.bolt.Update(func(tx *bbolt.Tx) error {
			extendErr = tl.extend(tx)
			return tx.Bucket(bucketMeta).Put([]byte("tail-test"), []byte("x"))
		}); err != nil {
			t.Fatalf("the transaction failed with the tail: %v", err)
		}
		return extendErr
	}
	if err := extend(); err == nil || !errors.Is(err, unix.EBADF) {
		t.Fatalf("extend on a read-only file: %v, want its write error", err)
	}
	for i := range tailRetryAfter {
		if err := extend(); err != nil {
			t.Fatalf("transaction %d after the failure tried the tail again: %v", i+1, err)
		}
	}
	if err := extend(); err == nil {
		t.Fatalf("after %d transactions the tail was not tried again", tailRetryAfter)
	}
}
