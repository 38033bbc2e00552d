// Package postgres is the second storage backend: every record the bolt
// backend (package storage) keeps, in a PostgreSQL database that more than
// one Breakwater instance shares. It implements the same interfaces, those
// docs/DESIGN.md lists under "What a storage backend implements", so the
// layers, the HTTP edge and the command line do not know which one they
// talk to.
//
// The connection string comes only from the environment (EnvURL): it holds
// a password. Open applies the schema migrations embedded in the binary
// under an advisory lock, so that instances starting together do not race,
// and refuses a database whose schema is newer than this binary's. Every
// session runs with synchronous_commit on: a lease or a usage row is on the
// server's disk before the call or the answer it covers.
package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL names the environment variable that holds the database's URL
// (postgres://user:password@host:port/db?sslmode=...), when
// [storage] backend = "postgres".
const EnvURL = "BREAKWATER_POSTGRES_URL"

// DefaultMaxConns bounds the pool when Options.MaxConns is zero: enough for
// the group commit's one writer, the batched event writer and the
// operator's reads, well under a small server's max_connections (100) with
// a few instances.
const DefaultMaxConns = 16

// DefaultConnectTimeout bounds the opening of one connection (the TCP
// connection, TLS, the start-up and the session's first query) when the
// URL sets no connect_timeout. Without a bound, a connection opened while
// the database's packets are dropped (a cut link, a firewall) waits for
// the kernel's SYN retries, about two minutes, and holds a place in the
// pool all that time: the pool's places run out during the cut, and once
// the link is back a write waits for those attempts' next retry, seconds
// after the database could answer it. Ample for a database across the
// world (a connection takes a few round trips).
const DefaultConnectTimeout = 2 * time.Second

// Errors returned by Open; callers test them with errors.Is.
var (
	// ErrNoURL means the environment variable EnvURL is empty.
	ErrNoURL = errors.New("postgres: " + EnvURL + " is not set (the connection string is read only from the environment)")
	// ErrNewerSchema means the database was migrated by a newer Breakwater.
	ErrNewerSchema = errors.New("postgres: the database schema is newer than this breakwater")
	// ErrClosed means the DB has been closed.
	ErrClosed = errors.New("postgres: database is closed")
)

// errBadURL is what Open and Probe answer for a URL they cannot use. It
// quotes nothing of the URL, nor pgx's message, which may: the URL holds a
// password. A password left raw is the usual cause, so it says how to
// write one.
var errBadURL = errors.New("postgres: " + EnvURL + " is not a valid connection string; " +
	"if its password (or user name) holds a character a URL reserves, write that character percent-encoded: " +
	"@ as %40, : as %3A, / as %2F, ? as %3F, # as %23, % as %25, a space as %20")

// rawReserved reports whether url, a postgres:// URL, has an @ after the
// first /, ? or #: the user information ends at its last @, so one of
// those is in it unencoded. Go's URL parser would take the host from the
// part before it and the database or the options from the password's
// rest, and a connection error would then show part of the password.
func rawReserved(url string) bool {
	rest, ok := strings.CutPrefix(url, "postgres://")
	if !ok {
		rest, ok = strings.CutPrefix(url, "postgresql://")
	}
	at, end := strings.LastIndex(rest, "@"), strings.IndexAny(rest, "/?#")
	return ok && at >= 0 && end >= 0 && at > end
}

// Options tune Open. The zero value is ready for production use.
type Options struct {
	// Logger receives the backend's few log lines. Default slog.Default().
	Logger *slog.Logger
	// MaxConns bounds the connection pool. Default DefaultMaxConns.
	MaxConns int32
	// Now is the clock for the records' times. Default time.Now.
	Now func() time.Time
	// LimitTimeout bounds one shared limit's decision (Limits). Default
	// LimitTimeout.
	LimitTimeout time.Duration
}

// DB is a Breakwater database in PostgreSQL. It is safe for concurrent use
// and by several processes at once.
type DB struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	now  func() time.Time
	// schema is the version the database is at after Open.
	schema int
	// rec is this instance's part of the records (ops.go).
	rec records
	// limitTimeout bounds a shared limit's decision (Options.LimitTimeout).
	limitTimeout time.Duration
	// syncStandby is whether the server of the newest connection has a
	// synchronous standby (synchronous_standby_names is set): the
	// counters then commit waiting for it too (money.go).
	syncStandby atomic.Bool
	// claims are the idempotency key claims owed a give-back
	// (claims_owed.go); closed ends their writer.
	claims    owedClaims
	closed    chan struct{}
	closeOnce sync.Once
}

// Open connects to the database at url, brings its schema up to this
// binary's version and returns it. ctx bounds the connection and the
// migrations. It refuses a URL that reaches a pooler in transaction or
// statement mode (ErrPooledTransactions).
func Open(ctx context.Context, url string, opts Options) (*DB, error) {
	db := &DB{log: opts.Logger, now: opts.Now, limitTimeout: cmp.Or(opts.LimitTimeout, LimitTimeout), closed: make(chan struct{})}
	pool, err := connect(ctx, url, opts.MaxConns, opts.Logger, opts.Now, db.syncStandby.Store)
	if err != nil {
		return nil, err
	}
	db.pool = pool
	if db.log == nil {
		db.log = slog.Default()
	}
	if db.now == nil {
		db.now = time.Now
	}
	if db.schema, err = migrate(ctx, pool, db.log); err != nil {
		pool.Close()
		return nil, err
	}
	return db, nil
}

// connect opens the pool to the database at url as `serve` (Open) and
// `config check` (Probe) both do, so that what the check finds is what
// serve gets: the same connection settings (poolConfig), a first
// connection, and the check that its sessions are whole (checkSessions:
// no pooler in transaction or statement mode in between).
//
// log and now are for the refused connections' log line, once a minute
// (connlog.go); nil takes slog.Default and time.Now.
//
// onSync, when not nil, is told at each new connection whether its server
// has a synchronous standby (synchronous_standby_names set): every new
// connection, the first after a failover included, says what the server
// it reached says.
func connect(ctx context.Context, url string, maxConns int32, log *slog.Logger, now func() time.Time, onSync func(bool)) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(url, maxConns, onSync)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = newConnTracer(log, now)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		c := cfg.ConnConfig
		return nil, fmt.Errorf("postgres: connect to %s: %w%s", c.Host, err, connectAdvice(err, c.User, c.Database)+tlsAdvice(err, c.Host))
	}
	if err := checkSessions(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// poolConfig is the connection configuration for url, pool bounded by
// maxConns (DefaultMaxConns when 0).
//
// Only application_name goes in the start-up message, which every pooler
// of note passes on (PgBouncer keeps track of it per client); a pooler
// refuses any other setting there (PgBouncer: "unsupported startup
// parameter"), and the usual way around that, telling it to ignore the
// setting, would drop it silently. So each session's own settings are set
// by a statement once it is connected (setupSession).
func poolConfig(url string, maxConns int32, onSync func(bool)) (*pgxpool.Config, error) {
	if url == "" {
		return nil, ErrNoURL
	}
	if rawReserved(url) {
		return nil, errBadURL
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, badURL(url) // pgx's message may quote the URL, password included
	}
	cfg.MaxConns = DefaultMaxConns
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "breakwater"
	if cfg.ConnConfig.ConnectTimeout == 0 { // connect_timeout in the URL (or PGCONNECT_TIMEOUT) wins
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error { return setupSession(ctx, c, onSync) }
	return cfg, nil
}

// setupSession runs on each new connection: whatever the server's default
// (or the URL's), a commit returns only once it is on the server's disk
// (and a synchronous standby's, if one is set up); and it notes the
// session, for outcome. One round trip, in the simple protocol: a
// prepared statement's name would be another session's too behind a
// transaction pooler, and fail there before checkSessions could say why.
func setupSession(ctx context.Context, c *pgx.Conn, onSync func(bool)) error {
	// The pool runs it outside the caller's deadline: bounded as the
	// connection's opening is (DefaultConnectTimeout), or a link cut just
	// after the connection opened would hold its place in the pool until
	// the kernel gives the connection up.
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.Config().ConnectTimeout, DefaultConnectTimeout))
	defer cancel()
	var s session
	var set string
	var sync bool
	err := c.QueryRow(ctx, `SELECT set_config('synchronous_commit', 'on', false), pg_backend_pid(),
		(SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()), current_setting('synchronous_standby_names') <> ''`,
		pgx.QueryExecModeSimpleProtocol).Scan(&set, &s.pid, &s.start, &sync)
	if err != nil {
		return err
	}
	c.PgConn().CustomData()[sessionKey] = s
	if onSync != nil {
		onSync(sync)
	}
	return nil
}

// Close closes every connection of the pool; it waits for queries in
// progress.
func (db *DB) Close() error {
	db.closeOnce.Do(func() { close(db.closed) })
	db.pool.Close()
	return nil
}

// Schema is the schema version the database is at.
func (db *DB) Schema() int { return db.schema }

// Pool is the connection pool, for the backend's parts in other files and
// for tests that look at the database directly.
func (db *DB) Pool() *pgxpool.Pool { return db.pool }
