package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"runtime/debug"
	"syscall"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// restoreHint ends every ErrDamaged message.
const restoreHint = "restore the file from a backup (see breakwater backup)"

// The parts of bbolt's file format Open reads itself, before bbolt maps
// the file: two meta pages, at page 0 and page 1, each a 16-byte page
// header and then the meta, in the machine's byte order. The meta names
// the page size, the root bucket's page, the freelist's page and pgid, the
// number of pages the file holds; a checksum (FNV-64a of the meta's first
// 56 bytes) follows them.
const (
	boltPageHeader = 16
	boltMetaSize   = 64
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	boltNoFreelist = ^uint64(0)
	boltMinPage    = 512
	boltMaxPage    = 1 << 24 // bbolt looks no further for the second meta
)

// boltMeta is one decoded meta page.
type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

// decodeMeta reads the meta page at the start of page, and reports
// whether it carries bbolt's magic number and whether it is valid (right
// version and checksum).
func decodeMeta(page []byte) (m boltMeta, magic, valid bool) {
	if len(page) < boltPageHeader+boltMetaSize {
		return boltMeta{}, false, false
	}
	b := page[boltPageHeader : boltPageHeader+boltMetaSize]
	ne := binary.NativeEndian
	if ne.Uint32(b[0:]) != boltMagic {
		return boltMeta{}, false, false
	}
	h := fnv.New64a()
	h.Write(b[:56])
	m = boltMeta{
		pageSize: ne.Uint32(b[8:]),
		root:     ne.Uint64(b[16:]), // root bucket: page id, then sequence
		freelist: ne.Uint64(b[32:]),
		pgid:     ne.Uint64(b[40:]),
		txid:     ne.Uint64(b[48:]),
	}
	return m, true, ne.Uint32(b[4:]) == boltVersion && ne.Uint64(b[56:]) == h.Sum64()
}

// checkFileSize reads the meta pages of the bbolt file f of size bytes the
// way bbolt will and refuses, with ErrDamaged, a file shorter than its
// meta says, or whose meta points past its end: bbolt would map it and
// the first read past the end would kill the process with SIGBUS. A file
// whose meta pages carry the magic number but are both invalid is damaged
// too. isBolt reports whether a valid meta page was found: a file without
// one passes, and bbolt.Open refuses it (Open reports ErrNotDatabase).
func checkFileSize(f io.ReaderAt, size int64) (isBolt bool, err error) {
	read := func(off int64) []byte {
		buf := make([]byte, boltPageHeader+boltMetaSize)
		if n, _ := f.ReadAt(buf, off); n < len(buf) {
			return nil
		}
		return buf
	}
	m0, magic0, ok0 := decodeMeta(read(0))
	var m1 boltMeta
	var magic1, ok1 bool
	if ok0 && m0.pageSize >= boltMinPage && m0.pageSize <= boltMaxPage {
		m1, magic1, ok1 = decodeMeta(read(int64(m0.pageSize)))
	} else {
		// As bbolt does: look for the second meta at every page size.
		for ps := int64(1024); ps <= boltMaxPage && ps < size; ps <<= 1 {
			if m1, magic1, ok1 = decodeMeta(read(ps)); ok1 {
				break
			}
		}
	}
	var m boltMeta
	switch {
	case ok0 && ok1 && m1.txid > m0.txid, !ok0 && ok1:
		m = m1
	case ok0:
		m = m0
	case magic0 || magic1:
		return false, fmt.Errorf("%w: both meta pages are damaged; %s", ErrDamaged, restoreHint)
	default:
		return false, nil
	}
	ps := uint64(m.pageSize)
	if ps < boltMinPage || ps > boltMaxPage {
		return true, fmt.Errorf("%w: the meta page gives a page size of %d bytes; %s", ErrDamaged, ps, restoreHint)
	}
	if m.pgid < 2 || m.pgid > uint64(1<<62)/ps {
		return true, fmt.Errorf("%w: the meta page says the file holds %d pages; %s", ErrDamaged, m.pgid, restoreHint)
	}
	if need := m.pgid * ps; uint64(size) < need {
		return true, fmt.Errorf("%w: the file is truncated: it is %d bytes, but its meta page says it holds %d pages of %d bytes (%d bytes) — a copy cut short or a full disk; %s",
			ErrDamaged, size, m.pgid, ps, need, restoreHint)
	}
	if m.root < 2 || m.root >= m.pgid || (m.freelist != boltNoFreelist && (m.freelist < 2 || m.freelist >= m.pgid)) {
		return true, fmt.Errorf("%w: the meta page points outside the file (root page %d, freelist page %d, %d pages); %s",
			ErrDamaged, m.root, m.freelist, m.pgid, restoreHint)
	}
	return true, nil
}

// checkFile runs checkFileSize on the file at path and returns its size;
// a missing or empty file (a new database) passes with size 0.
func checkFile(path string) (size int64, isBolt bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || info.Size() == 0 {
		return 0, false, err
	}
	isBolt, err = checkFileSize(f, info.Size())
	return info.Size(), isBolt, err
}

// guard runs fn and turns a panic in it, and a memory fault in this
// goroutine (a read of a mapped page the file no longer backs), into an
// ErrDamaged error: bbolt asserts what it reads of its pages by panicking.
func guard(what string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s failed: %v; %s", ErrDamaged, what, r, restoreHint)
		}
	}()
	return fn()
}

// openBolt opens the bbolt file at path under guard. If bbolt panics
// inside Open, the file it opened and locked cannot be closed (bbolt
// returned no handle): Open's caller is about to give up on the database
// anyway.
func openBolt(path string, opts *bbolt.Options) (*bbolt.DB, error) {
	var bdb *bbolt.DB
	err := guard("reading the database", func() error {
		var err error
		bdb, err = bbolt.Open(path, 0o600, opts)
		return err
	})
	return bdb, err
}

// openError says what an error of bbolt.Open on an existing file of size
// bytes means: another process holds it; the file is no bbolt database
// (isBolt false: checkFile found no valid meta page, or bbolt found the
// meta pages invalid); or something else failed (memory for the mapping,
// the disk), which is reported as what it is.
func openError(err error, size int64, isBolt bool) error {
	var errno syscall.Errno
	var pathErr *fs.PathError
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return ErrLocked
	case errors.Is(err, ErrDamaged), errors.As(err, &pathErr):
		return err
	case errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.EAGAIN):
		return fmt.Errorf("not enough memory to map the %d-byte database file (mmap: %w); free memory, or raise the process's address-space or memory limit (ulimit -v, systemd MemoryMax)", size, err)
	case errors.As(err, &errno):
		return fmt.Errorf("map the database file: %w", err)
	case size > 0 && (!isBolt || errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrChecksum)):
		// bbolt writes nothing to an existing non-empty file before it
		// validates it.
		return fmt.Errorf("%w: %w", ErrNotDatabase, err)
	}
	return err
}

// check runs bbolt's consistency check over the whole file and reports
// what it finds as ErrDamaged (the first few problems).
func check(bdb *bbolt.DB) error {
	var problems []error
	err := bdb.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			if len(problems) < 5 {
				problems = append(problems, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %w; %s", ErrDamaged, errors.Join(problems...), restoreHint)
	}
	return nil
}
