package storage

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/server/keys"
)

// quietLogger discards storage's log lines in tests.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// mustOpen opens a new database in a temporary folder and closes it when the
// test ends.
func mustOpen(tb testing.TB) *DB {
	tb.Helper()
	return mustOpenPath(tb, filepath.Join(tb.TempDir(), "breakwater.db"), Options{})
}

// mustOpenPath opens the database at path and closes it when the test ends.
func mustOpenPath(tb testing.TB, path string, opts Options) *DB {
	tb.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger
	}
	if opts.Timeout == 0 {
		opts.Timeout = 50 * time.Millisecond
	}
	db, err := Open(path, opts)
	if err != nil {
		tb.Fatalf("Open(%q): %v", path, err)
	}
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return db
}

func TestConfig(t *testing.T) {
	tests := []struct {
		name    string
		in      Config
		want    Config
		wantErr string // substring; empty means valid
	}{
		{
			name: "zero means defaults",
			in:   Config{},
			want: Config{Backend: BackendBolt, Path: DefaultPath, StatsRetentionDays: DefaultStatsRetentionDays, PostgresMaxConnections: DefaultPostgresMaxConnections},
		},
		{
			name: "set values kept",
			in:   Config{Backend: BackendPostgres, Path: "/var/lib/bw.db", StatsRetentionDays: 7, PostgresMaxConnections: 4},
			want: Config{Backend: BackendPostgres, Path: "/var/lib/bw.db", StatsRetentionDays: 7, PostgresMaxConnections: 4},
		},
		{
			name:    "negative retention",
			in:      Config{StatsRetentionDays: -1},
			want:    Config{Backend: BackendBolt, Path: DefaultPath, StatsRetentionDays: -1, PostgresMaxConnections: DefaultPostgresMaxConnections},
			wantErr: "storage.stats_retention_days",
		},
		{
			name:    "unknown backend",
			in:      Config{Backend: "sqlite"},
			want:    Config{Backend: "sqlite", Path: DefaultPath, StatsRetentionDays: DefaultStatsRetentionDays, PostgresMaxConnections: DefaultPostgresMaxConnections},
			wantErr: "storage.backend",
		},
		{
			name:    "a pool too small for an instance",
			in:      Config{Backend: BackendPostgres, PostgresMaxConnections: 3},
			want:    Config{Backend: BackendPostgres, Path: DefaultPath, StatsRetentionDays: DefaultStatsRetentionDays, PostgresMaxConnections: 3},
			wantErr: "storage.postgres_max_connections",
		},
		{
			name:    "a negative pool",
			in:      Config{Backend: BackendPostgres, PostgresMaxConnections: -1},
			want:    Config{Backend: BackendPostgres, Path: DefaultPath, StatsRetentionDays: DefaultStatsRetentionDays, PostgresMaxConnections: -1},
			wantErr: "storage.postgres_max_connections",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.WithDefaults()
			if got != tt.want {
				t.Errorf("WithDefaults() = %+v, want %+v", got, tt.want)
			}
			err := got.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Validate() = %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

func TestOpenCreatesFoldersBucketsAndSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "breakwater.db")
	db := mustOpenPath(t, path, Options{})

	if got, want := db.Path(), path; got != want {
		t.Errorf("Path() = %q, want %q", got, want)
	}
	info, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.Mode().Perm(), os.FileMode(0o700); got != want {
		t.Errorf("folder mode = %v, want %v", got, want)
	}
	err = db.view(func(tx *bbolt.Tx) error {
		for _, name := range allBuckets {
			if tx.Bucket(name) == nil {
				t.Errorf("bucket %s missing", name)
			}
		}
		if got, want := tx.Bucket(bucketMeta).Get(keySchemaVersion), encodeUint64(SchemaVersion); !bytes.Equal(got, want) {
			t.Errorf("schema version = %x, want %x", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breakwater.db")
	db, err := Open(path, Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	want := keys.User{ID: "u1", Plan: "pro", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	if err := db.PutUser(want); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = mustOpenPath(t, path, Options{})
	got, err := db.User("u1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) || got.Plan != want.Plan || got.ID != want.ID {
		t.Errorf("User after reopen = %+v, want %+v", got, want)
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breakwater.db")
	mustOpenPath(t, path, Options{})

	start := time.Now()
	db, err := Open(path, Options{Timeout: 50 * time.Millisecond, Logger: quietLogger})
	if err == nil {
		db.Close()
		t.Fatal("second Open succeeded, want ErrLocked")
	}
	if !errors.Is(err, ErrLocked) {
		t.Errorf("second Open = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the path", err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("second Open took %v, want about the 50ms timeout", elapsed)
	}
}

func TestOpenRefusesGarbage(t *testing.T) {
	tests := []struct {
		name string
		data []byte
	}{
		{name: "short text", data: []byte("hello, I am not a database\n")},
		{name: "one page of zeros", data: make([]byte, 4096)},
		{name: "many pages of pattern", data: bytes.Repeat([]byte("breakwater!"), 10000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "breakwater.db")
			if err := os.WriteFile(path, tt.data, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err := Open(path, Options{Timeout: 50 * time.Millisecond, Logger: quietLogger})
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded on garbage")
			}
			if !errors.Is(err, ErrNotDatabase) {
				t.Errorf("Open = %v, want ErrNotDatabase", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.data) {
				t.Errorf("file changed: %d bytes, want the original %d", len(got), len(tt.data))
			}
		})
	}
}

// writeBolt creates a bbolt file at path and runs fn in an Update on it.
func writeBolt(t *testing.T, path string, fn func(tx *bbolt.Tx) error) {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesOtherBoltFiles(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(tx *bbolt.Tx) error
		wantErr error
	}{
		{
			name: "foreign buckets",
			setup: func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket([]byte("widgets"))
				if err != nil {
					return err
				}
				return b.Put([]byte("w1"), []byte("blue"))
			},
			wantErr: ErrNotDatabase,
		},
		{
			name: "meta without schema version",
			setup: func(tx *bbolt.Tx) error {
				_, err := tx.CreateBucket(bucketMeta)
				return err
			},
			wantErr: ErrNotDatabase,
		},
		{
			name: "schema version 0",
			setup: func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket(bucketMeta)
				if err != nil {
					return err
				}
				return b.Put(keySchemaVersion, encodeUint64(0))
			},
			wantErr: ErrNotDatabase,
		},
		{
			name: "newer schema",
			setup: func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket(bucketMeta)
				if err != nil {
					return err
				}
				return b.Put(keySchemaVersion, encodeUint64(SchemaVersion+1))
			},
			wantErr: ErrNewerSchema,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "other.db")
			writeBolt(t, path, tt.setup)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}

			db, err := Open(path, Options{Timeout: 50 * time.Millisecond, Logger: quietLogger})
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("Open = %v, want %v", err, tt.wantErr)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Error("Open changed a file it refused")
			}
			// The refused file must be released: the lock is free again.
			writeBolt(t, path, func(*bbolt.Tx) error { return nil })
		})
	}
}

func TestOpenEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breakwater.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	db := mustOpenPath(t, path, Options{})
	if _, err := db.Users(); err != nil {
		t.Errorf("Users on a database made from an empty file: %v", err)
	}
}

func TestClosed(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "breakwater.db"), Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	select {
	case <-db.writerDone:
	default:
		t.Error("writer goroutine still running after Close")
	}

	calls := []struct {
		name string
		call func() error
	}{
		{"RecordUsage", func() error {
			return db.RecordUsage(t.Context(), "2026-01", budget.UsageRecord{Time: time.Now(), UserID: "u1"}, budget.Settlement{})
		}},
		{"User", func() error { _, err := db.User("u1"); return err }},
		{"Users", func() error { _, err := db.Users(); return err }},
		{"Keys", func() error { _, err := db.Keys(); return err }},
		{"PutUser", func() error { return db.PutUser(keys.User{ID: "u1"}) }},
		{"QuotaUsed", func() error { _, err := db.QuotaUsed("2026-01"); return err }},
		{"Usage", func() error { _, err := db.Usage(time.Time{}, time.Time{}); return err }},
		{"AppendEvents", func() error { return db.AppendEvents([]detect.Event{{Time: time.Now()}}) }},
		{"Events", func() error { _, err := db.Events(time.Time{}, time.Time{}); return err }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			if err := c.call(); !errors.Is(err, ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", c.name, err)
			}
		})
	}
}

// A database has an identity from its first open for writing; reopening
// and a backup's copy keep it, and another database has another. A file
// from before identities has none until it is opened for writing.
func TestDatabaseIDIsKeptByCopies(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := db.ID()
	if err != nil || len(id) != 32 {
		t.Fatalf("new database's id %q (%v), want 32 hex digits", id, err)
	}
	copyPath := filepath.Join(dir, "copy.db")
	f, err := os.Create(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Backup(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A file from before identities: the key removed.
	if err := db.update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyDatabaseID) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for _, p := range []string{copyPath} {
		ro, err := Open(p, Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := ro.ID(); got != id {
			t.Errorf("%s: id %q, want the original's %q", p, got, id)
		}
		ro.Close()
	}
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := ro.ID(); got != "" {
		t.Errorf("a file without an id read only: %q, want none (a read-only open writes nothing)", got)
	}
	ro.Close()
	rw, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := rw.ID()
	rw.Close()
	if len(again) != 32 || again == id {
		t.Errorf("the old file's new id %q: want a new one", again)
	}
	other, err := Open(filepath.Join(dir, "b.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if got, _ := other.ID(); got == id || got == again {
		t.Errorf("another database shares the id %q", got)
	}
}
