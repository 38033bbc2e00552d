// Package storage provides Breakwater's durable state: one BoltDB file that
// holds users, API keys, invite codes, plan quotas, usage records,
// statistics events and what detection makes of them (daily aggregates,
// findings, alert state).
//
// Money writes (the quota increment and its usage row) go through a group
// commit: concurrent callers share one transaction and one fsync, and each
// returns only once its write is on disk. Statistics events are written with a
// plain transaction, apart from billing.
//
// BoltDB takes an exclusive lock on its file, so exactly one process owns the
// database; a second Open fails with ErrLocked instead of waiting. Storage
// refuses to open a file that is not a Breakwater database, and never writes
// to one; it refuses a damaged file (truncated, or with pages bbolt cannot
// read) with an error that says so, rather than crash on it. It keeps no state in memory beyond the open file: live counters and
// windows belong to the packages that use them. It is the only package that
// imports bbolt.
//
// The money records (usage rows, settlements, ledger days) are declared by
// budget, the statistics events and what detection makes of them by
// detect, the keys and users by server/keys and the invites by
// server/invites, each with the interfaces it needs from a database and
// its not-found sentinel; DB implements those interfaces (and wraps
// ErrNotFound with the owner's sentinel), so none of them imports storage.
package storage

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"breakwater/budget"
	"breakwater/detect"
	"breakwater/server/invites"
	"breakwater/server/keys"
)

// DefaultPath is the database file used when Config.Path is empty.
const DefaultPath = "data/breakwater.db"

// DefaultStatsRetentionDays is how many days of raw statistics events are
// kept when Config.StatsRetentionDays is zero.
const DefaultStatsRetentionDays = 30

// DefaultTimeout is how long Open waits for the file lock when
// Options.Timeout is zero.
const DefaultTimeout = time.Second

// SchemaVersion is the version of the bucket layout this code writes. A
// database with a newer version is refused; an older one is brought up to
// this version by the migrations at Open.
//
//	1: the first layout
//	2: invite redemptions in a bucket per invite under invite_redemptions,
//	   and a use count in the invite record, instead of a list in the record
//	3: users who sign in with a JWT under their own ids, "jwt:" + sub,
//	   instead of the sub alone (their user records and quota counts moved)
//	4: usage rows and stored answers written in a binary form (older JSON
//	   rows are still read as they are; an older build, which could not
//	   read the new rows, refuses the file instead)
//	5: statistics events written in a binary form (older JSON events are
//	   still read; as for 4, an older build refuses the file)
const SchemaVersion uint64 = 5

// migration brings a database from schema version to-1 up to version to.
// run is called inside prepare's one transaction, after every bucket of
// the current layout exists; it returns log attributes that say what it
// did. A migration must change nothing when run again.
type migration struct {
	to   uint64
	what string
	run  func(tx *bbolt.Tx) ([]any, error)
}

// migrations, in order of version.
var migrations = []migration{
	{to: 2, what: "invite redemptions into a bucket per invite", run: migrateInviteRedemptions},
	{to: 3, what: "JWT users under jwt:SUB", run: migrateJWTUsers},
	{to: 4, what: "binary usage rows and answers from now on", run: func(*bbolt.Tx) ([]any, error) { return nil, nil }},
	{to: 5, what: "binary statistics events from now on", run: func(*bbolt.Tx) ([]any, error) { return nil, nil }},
}

// Errors returned by storage. Callers test them with errors.Is; most are
// wrapped with the path or the record they concern.
var (
	// ErrLocked means another process (or another DB in this process) holds
	// the database file.
	ErrLocked = errors.New("storage: database is locked by another breakwater process")
	// ErrOldSchema means a read-only open met a database that needs a
	// migration first.
	ErrOldSchema = errors.New("storage: the database needs a migration")

	// ErrNotFound means the requested record does not exist. For a key
	// or a user it is also keys.ErrNotFound, for an invite
	// invites.ErrNotFound.
	ErrNotFound = errors.New("storage: not found")

	// ErrClosed means the DB has been closed.
	ErrClosed = errors.New("storage: database is closed")

	// ErrExists means a record with the same identity is already stored.
	ErrExists = errors.New("storage: already exists")

	// ErrNotDatabase means the file exists but is not a Breakwater database;
	// the file is left untouched.
	ErrNotDatabase = errors.New("storage: file is not a breakwater database")

	// ErrDamaged means the file is a BoltDB file that cannot be read as
	// it is: shorter than its meta page says (truncated), with damaged
	// meta pages, or with a page bbolt cannot make sense of. The message
	// names what was found; the remedy is a backup.
	ErrDamaged = errors.New("storage: the database is damaged")

	// ErrNoDatabase means Options.MustExist was set and no file is at the
	// path: an operator command pointed at the wrong place must not create
	// an empty database and report on it.
	ErrNoDatabase = errors.New("storage: no database at this path")

	// ErrNewerSchema means the database was written by a newer Breakwater
	// whose schema this code does not know.
	ErrNewerSchema = errors.New("storage: database schema is newer than this breakwater")

	// ErrInvalid means a record is missing a required field or has a value
	// storage cannot encode; nothing was written.
	ErrInvalid = errors.New("storage: invalid record")
)

// The backends [storage] backend names.
const (
	// BackendBolt is one BoltDB file, owned by one process: the default.
	BackendBolt = "bolt"
	// BackendPostgres is a PostgreSQL database that several instances
	// share (package storage/postgres); its URL comes only from the
	// environment, BREAKWATER_POSTGRES_URL.
	BackendPostgres = "postgres"
)

// Config is the [storage] section of config.toml.
type Config struct {
	// Backend is where the records live: BackendBolt (default) or
	// BackendPostgres.
	Backend string `koanf:"backend"`

	// Path is the database file of the bolt backend. Its parent folders are created (mode 0700)
	// when missing. Default DefaultPath.
	Path string `koanf:"path"`

	// StatsRetentionDays is how many days of raw statistics events are kept
	// before the daily aggregation deletes them; the same run deletes,
	// past it, the other personal data (see DB.PrunePersonal). Default
	// DefaultStatsRetentionDays (30); negative is an error.
	StatsRetentionDays int `koanf:"stats_retention_days"`

	// PostgresMaxConnections bounds each instance's pool of connections to
	// PostgreSQL (backend "postgres"; the instance opens one more, which
	// listens for the other instances' changes). Default
	// DefaultPostgresMaxConnections; below MinPostgresMaxConnections is an
	// error. Ignored by the bolt backend.
	PostgresMaxConnections int `koanf:"postgres_max_connections"`
}

// DefaultPostgresMaxConnections is the pool of an instance on PostgreSQL
// when Config.PostgresMaxConnections is zero: the usage records' writers,
// the admissions, the background work and the operator's reads at once,
// with room for a few instances under a small server's max_connections
// (100).
const DefaultPostgresMaxConnections = 16

// MinPostgresMaxConnections is the smallest pool an instance works with:
// the usage records' writer, an admission, the leader's lock and the
// operator at once.
const MinPostgresMaxConnections = 4

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Backend == "" {
		c.Backend = BackendBolt
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.StatsRetentionDays == 0 {
		c.StatsRetentionDays = DefaultStatsRetentionDays
	}
	if c.PostgresMaxConnections == 0 {
		c.PostgresMaxConnections = DefaultPostgresMaxConnections
	}
	return c
}

// Validate reports the first invalid setting of c, naming its config key.
// Zero fields are valid: they mean the defaults.
func (c Config) Validate() error {
	switch c.Backend {
	case "", BackendBolt, BackendPostgres:
	default:
		return fmt.Errorf("storage.backend: %q is neither %q nor %q", c.Backend, BackendBolt, BackendPostgres)
	}
	if c.StatsRetentionDays < 0 {
		return fmt.Errorf("storage.stats_retention_days: %d is negative", c.StatsRetentionDays)
	}
	if c.PostgresMaxConnections != 0 && c.PostgresMaxConnections < MinPostgresMaxConnections {
		return fmt.Errorf("storage.postgres_max_connections: %d is below %d (0 means the default, %d)",
			c.PostgresMaxConnections, MinPostgresMaxConnections, DefaultPostgresMaxConnections)
	}
	return nil
}

// Options tune Open. The zero value is ready for production use.
type Options struct {
	// Timeout is how long Open waits for the file lock before it returns
	// ErrLocked. Zero or negative means DefaultTimeout (1s); Open never
	// waits forever.
	Timeout time.Duration

	// Logger receives storage's few log lines. Default slog.Default().
	Logger *slog.Logger

	// Check reads every page of the file at Open (bbolt's consistency
	// check) and refuses a damaged one with ErrDamaged, naming what is
	// wrong. It costs a read of the whole file, so it is off by default:
	// without it Open still refuses a truncated file and turns a damaged
	// page met while opening into ErrDamaged instead of a crash.
	Check bool

	// MustExist refuses, with ErrNoDatabase, to create a database that is
	// not there yet (nor its folder).
	MustExist bool

	// ReadOnly opens an existing database for reading only: nothing is
	// written to the file, not even at open (no bucket is created and no
	// migration runs, so a database of an older schema is refused with
	// ErrOldSchema), and other read-only opens may share it. Every write
	// fails.
	ReadOnly bool

	// NoSync skips fsync after each commit. For benchmarks and throwaway
	// databases only: a crash can lose or corrupt committed data.
	NoSync bool
}

// Bucket names. Every bucket is created at Open.
var (
	bucketMeta      = []byte("meta")       // schema_version -> uint64, database_id -> hex
	bucketUsers     = []byte("users")      // user id -> JSON User
	bucketKeys      = []byte("keys")       // key id -> JSON Key
	bucketKeyHashes = []byte("key_hashes") // sha-256 hash -> key id
	bucketQuota     = []byte("quota")      // "2006-01" -> bucket of user id -> uint64
	bucketUsage     = []byte("usage")      // timeKey -> budget.UsageRecord (binary; JSON before schema 4)
	bucketEvents    = []byte("events")     // timeKey -> detect.Event row (events.go)

	bucketBudgetDays   = []byte("budget_days")        // "2006-01-02" -> requests, spend
	bucketReservations = []byte("reservations")       // id -> JSON open reservation
	bucketDefense      = []byte("defense")            // state name -> bucket of key -> opaque value
	bucketInvites      = []byte("invites")            // sha-256 of the normalised code -> JSON Invite
	bucketRedemptions  = []byte("invite_redemptions") // invite's sha-256 -> bucket of e-mail -> JSON redemptionValue

	bucketAggregates     = []byte("aggregates")      // "2006-01-02" -> JSON detect.DayStats
	bucketFindings       = []byte("findings")        // "2006-01-02" -> bucket of index -> JSON detect.Finding
	bucketDetectRuns     = []byte("detect_runs")     // "2006-01-02" -> JSON detect.RunRecord
	bucketDetectAttempts = []byte("detect_attempts") // "2006-01-02" -> runs started and not finished
	bucketAlerts         = []byte("alerts")          // alert kind -> JSON detect.AlertState

	bucketIdempotency = []byte("idempotency")  // user id, 0, key -> storedAnswer (binary; JSON before schema 4)
	bucketRecentReads = []byte("recent_reads") // user id, 0, fingerprint -> storedAnswer (binary; JSON before schema 4)

	allBuckets = [][]byte{
		bucketMeta, bucketUsers, bucketKeys, bucketKeyHashes,
		bucketQuota, bucketUsage, bucketEvents,
		bucketBudgetDays, bucketReservations, bucketDefense, bucketInvites, bucketRedemptions,
		bucketAggregates, bucketFindings, bucketDetectRuns, bucketDetectAttempts, bucketAlerts,
		bucketIdempotency, bucketRecentReads,
	}

	keySchemaVersion = []byte("schema_version")
	// keyDatabaseID is the database's identity, 16 random bytes in hex
	// given at its first open for writing: a copy (a backup) keeps it,
	// which is how a migration into PostgreSQL knows a file it has taken
	// figures from before (ID).
	keyDatabaseID = []byte("database_id")
)

// What DB implements of the interfaces the deciding packages declare: a
// second backend implements the same, and main wires it in DB's place.
var (
	_ budget.Ledger      = (*DB)(nil)
	_ detect.Store       = (*DB)(nil)
	_ detect.EventWriter = (*DB)(nil)
	_ detect.AlertStore  = (*DB)(nil)
	_ keys.KeyStore      = (*DB)(nil)
	_ invites.Store      = (*DB)(nil)
	_ invites.Redeemer   = (*DB)(nil)
)

// DB is an open Breakwater database. Its methods are safe for concurrent
// use. Close it when done.
type DB struct {
	bolt   *bbolt.DB
	path   string
	logger *slog.Logger

	// mu guards closed and every send on queue, so that Close can close
	// queue without racing a sender.
	mu         sync.RWMutex
	closed     bool
	queue      chan commitRequest
	writerDone chan struct{}
	tail       *tail // the writer's; nil when read only

	closeOnce sync.Once
	closeErr  error

	// Group commit counters, for tests and benchmarks.
	txs      atomic.Int64 // transactions run, including rolled-back ones
	answered atomic.Int64 // requests answered
}

// Open opens the Breakwater database at path, creating the file and its
// parent folders when missing. It refuses a file that is not a Breakwater
// database (ErrNotDatabase), that a newer Breakwater wrote
// (ErrNewerSchema) or that is damaged (ErrDamaged: truncated, or a page
// bbolt cannot read; with opts.Check, anything bbolt's consistency check
// finds), and fails with ErrLocked when another process holds the file for
// longer than opts.Timeout. A failure to map the file into memory is
// reported as such.
func Open(path string, opts Options) (*DB, error) {
	if path == "" {
		return nil, fmt.Errorf("open database: %w: empty path", ErrInvalid)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MustExist || opts.ReadOnly {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open %s: %w", path, ErrNoDatabase)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open %s: folder: %w", path, err)
	}

	// Read the meta pages before bbolt maps the file: a file shorter than
	// its meta says would end the process with SIGBUS at the first read
	// past its end, where no recover reaches.
	size, isBolt, err := checkFile(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	bdb, err := openBolt(path, &bbolt.Options{
		Timeout:  opts.Timeout,
		NoSync:   opts.NoSync,
		ReadOnly: opts.ReadOnly,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, openError(err, size, isBolt))
	}

	var version uint64
	err = guard("reading the database", func() error {
		var err error
		if opts.ReadOnly {
			version, err = schemaVersion(bdb)
			if err == nil && version > SchemaVersion {
				err = fmt.Errorf("%w: schema version %d, this build knows up to %d", ErrNewerSchema, version, SchemaVersion)
			} else if err == nil && version != SchemaVersion {
				err = fmt.Errorf("%w: schema version %d, this build reads %d only after migrating it (start the server once)", ErrOldSchema, version, SchemaVersion)
			}
			if err != nil {
				return err
			}
		} else if version, err = prepare(bdb, opts.Logger.With("component", "storage")); err != nil {
			return err
		}
		if opts.Check {
			return check(bdb)
		}
		return nil
	})
	if err != nil {
		_ = guard("closing the database", bdb.Close) // the open error matters more
		return nil, fmt.Errorf("open %s: %w", path, err)
	}

	db := &DB{
		bolt:       bdb,
		path:       path,
		logger:     opts.Logger.With("component", "storage"),
		queue:      make(chan commitRequest, queueSize),
		writerDone: make(chan struct{}),
	}
	if !opts.ReadOnly {
		if db.tail, err = openTail(path); err != nil {
			db.logger.Warn("the file's tail will not be written ahead of the data (commits may be slower)", "err", err)
		}
	}
	go db.writer()
	db.logger.Info("database opened", "path", path, "schema_version", version)
	return db, nil
}

// schemaVersion reads the stored schema version of a database opened read
// only.
func schemaVersion(bdb *bbolt.DB) (uint64, error) {
	var version uint64
	err := bdb.View(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: no %s bucket", ErrNotDatabase, bucketMeta)
		}
		v := meta.Get(keySchemaVersion)
		if len(v) != 8 {
			return fmt.Errorf("%w: no schema version", ErrNotDatabase)
		}
		version = binary.BigEndian.Uint64(v)
		return nil
	})
	return version, err
}

// prepare checks that bdb holds a Breakwater database (or nothing), then in
// one transaction creates every bucket, runs the migrations from the
// stored schema version up to SchemaVersion and stores that version. It
// writes nothing to a file it refuses, and nothing at all when a migration
// fails: the database stays at its old version.
func prepare(bdb *bbolt.DB, logger *slog.Logger) (uint64, error) {
	var version uint64 // 0: a new file
	err := bdb.View(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			empty := true
			_ = tx.ForEach(func([]byte, *bbolt.Bucket) error {
				empty = false
				return errStop
			})
			if !empty {
				return fmt.Errorf("%w: no %s bucket", ErrNotDatabase, bucketMeta)
			}
			return nil // a new file
		}
		v := meta.Get(keySchemaVersion)
		if len(v) != 8 {
			return fmt.Errorf("%w: no schema version", ErrNotDatabase)
		}
		version = binary.BigEndian.Uint64(v)
		switch {
		case version > SchemaVersion:
			return fmt.Errorf("%w: schema version %d, this build knows up to %d",
				ErrNewerSchema, version, SchemaVersion)
		case version == 0:
			return fmt.Errorf("%w: schema version 0", ErrNotDatabase)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}

	type applied struct {
		m     migration
		attrs []any
	}
	var done []applied
	err = bdb.Update(func(tx *bbolt.Tx) error {
		done = done[:0]
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		for _, m := range migrations {
			if version == 0 || m.to <= version {
				continue // a new file has nothing to migrate
			}
			attrs, err := m.run(tx)
			if err != nil {
				return fmt.Errorf("migrate to schema version %d (%s): %w", m.to, m.what, err)
			}
			done = append(done, applied{m, attrs})
		}
		meta := tx.Bucket(bucketMeta)
		if meta.Get(keyDatabaseID) == nil {
			var id [16]byte
			_, _ = rand.Read(id[:])
			if err := meta.Put(keyDatabaseID, []byte(hex.EncodeToString(id[:]))); err != nil {
				return fmt.Errorf("database id: %w", err)
			}
		}
		if bytes.Equal(meta.Get(keySchemaVersion), encodeUint64(SchemaVersion)) {
			return nil
		}
		if err := meta.Put(keySchemaVersion, encodeUint64(SchemaVersion)); err != nil {
			return fmt.Errorf("schema version: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, d := range done {
		logger.Info("database migrated", append([]any{"schema_version", d.m.to, "what", d.m.what}, d.attrs...)...)
	}
	return SchemaVersion, nil
}

// ID is the database's identity: given at its first open for writing,
// kept by every copy of the file. "" for a file no Breakwater with IDs
// has opened for writing yet.
func (db *DB) ID() (string, error) {
	var id string
	err := db.view(func(tx *bbolt.Tx) error {
		id = string(tx.Bucket(bucketMeta).Get(keyDatabaseID))
		return nil
	})
	return id, err
}

// errStop ends a ForEach early.
var errStop = errors.New("storage: stop iteration")

// Path returns the path of the database file, as given to Open.
func (db *DB) Path() string { return db.path }

// Close stops accepting group-commit writes (later ones get ErrClosed),
// commits every write already queued, waits for their callers to be
// answered, then closes the file. Reads and plain writes that are running
// finish first; later ones get ErrClosed. Close is idempotent: later calls
// return the first call's result.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		db.mu.Lock()
		db.closed = true
		close(db.queue)
		db.mu.Unlock()

		<-db.writerDone
		db.tail.close()
		if err := db.bolt.Close(); err != nil {
			db.closeErr = fmt.Errorf("close %s: %w", db.path, err)
		}
		db.logger.Info("database closed", "path", db.path)
	})
	return db.closeErr
}

// view runs fn in a read-only transaction, mapping a closed database to
// ErrClosed, and a damaged page, which bbolt reports by panicking, to
// ErrDamaged naming the file.
func (db *DB) view(fn func(tx *bbolt.Tx) error) error {
	return closedErr(guard("reading "+db.path, func() error { return db.bolt.View(fn) }))
}

// update runs fn in its own read-write transaction (no group commit),
// mapping a closed database to ErrClosed and a damaged page to
// ErrDamaged.
func (db *DB) update(fn func(tx *bbolt.Tx) error) error {
	return closedErr(guard("writing "+db.path, func() error { return db.bolt.Update(fn) }))
}

func closedErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}
