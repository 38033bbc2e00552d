package storage

import (
	"fmt"
	"os"

	"go.etcd.io/bbolt"
)

// The file's tail, written ahead of bbolt.
//
// bbolt grows its file with ftruncate, which leaves a hole: the first write
// to each new page then allocates a block, and the fdatasync of that
// commit must also commit the filesystem's journal (ext4, xfs). A database
// of usage rows grows at nearly every commit, so nearly every commit paid
// for it: on the 2-core VM of bench/load, fdatasync of one page took about
// 0.47 ms into a hole and 0.27 ms over a block already written (0.70 and
// 0.44 ms with the cores busy), and a server whose file had zeros past its
// data answered about 7% more paid reads a second on 7% less CPU each.
//
// So the group-commit writer keeps the bytes past bbolt's last page
// written with zeros, at least tailChunk and at most twice that ahead.
// bbolt never reads a page past its last one (the meta page's high-water
// mark), and a file longer than its data is what bbolt's own growth leaves
// too, so the zeros change nothing it reads; bbolt's grow sees a file
// already long enough and leaves it be. The writes run inside a write
// transaction, which holds bbolt's writer lock: no transaction can
// allocate pages while they are made, and they start at or past the
// transaction's high-water mark, which is fixed until its commit.

const (
	// tailChunk is how far ahead of the data the file is kept written.
	tailChunk = 1 << 20
	// tailRetryAfter is how many transactions go by without the tail
	// after a write of it failed (a full disk), before it is tried again.
	tailRetryAfter = 1000
	// tailWrite is the most written at once (the zeros kept in memory).
	tailWrite = 128 << 10
)

// tail writes the file's tail ahead of bbolt; used only by the writer
// goroutine.
type tail struct {
	f       *os.File // the database file, opened again for writing; nil: off
	written int64    // the file has no hole from the data's end to here
	skip    int      // transactions still to go by after a failure
	zeros   []byte
}

// openTail opens path again for writing the tail. It starts with nothing
// known to be written past the data: the first extend writes its chunk.
func openTail(path string) (*tail, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("tail: %w", err)
	}
	return &tail{f: f}, nil
}

// extend writes zeros past the data of tx, a write transaction that has
// not committed yet, when fewer than tailChunk bytes past the data are
// known to be written. A failure (a full disk) is returned to be logged
// and nothing else: the zeros save time, bbolt does not need them, and
// the next tailRetryAfter transactions go without them. (On a full disk,
// the zeros already written are room that bbolt's pages can still take.)
func (t *tail) extend(tx *bbolt.Tx) error {
	if t == nil || t.f == nil {
		return nil
	}
	if t.skip > 0 {
		t.skip--
		return nil
	}
	end := tx.Size() // the high-water mark: every page bbolt uses lies below it
	if t.written >= end+tailChunk {
		return nil
	}
	from, to := max(t.written, end), end+2*tailChunk
	if t.zeros == nil {
		t.zeros = make([]byte, tailWrite)
	}
	for off := from; off < to; {
		n, err := t.f.WriteAt(t.zeros[:min(int64(len(t.zeros)), to-off)], off)
		if err != nil {
			t.skip = tailRetryAfter
			return fmt.Errorf("writing the file's tail ahead of the data (tried again after %d commits): %w", tailRetryAfter, err)
		}
		off += int64(n)
	}
	t.written = to
	return nil
}

// close closes the tail's file and turns extend off; the writer has
// stopped.
func (t *tail) close() {
	if t != nil && t.f != nil {
		_ = t.f.Close()
		t.f, t.zeros = nil, nil
	}
}
