package postgres

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connLogEvery is how often at most a connection that could not be made
// is logged, per cause: a server at max_connections refuses every new
// connection of every request, and the log says so once, not per request.
const connLogEvery = time.Minute

// connTracer logs the connections the pool (and the listener) could not
// make, at most once every connLogEvery per cause (the server's SQLSTATE,
// or "unreachable"). A request that needs a connection never waits for
// one beyond its own deadline: pgx returns the server's refusal at once,
// and the money path refuses the request (503, no upstream call).
type connTracer struct {
	log *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	last map[string]time.Time
}

func newConnTracer(log *slog.Logger, now func() time.Time) *connTracer {
	if log == nil {
		log = slog.Default()
	}
	if now == nil {
		now = time.Now
	}
	return &connTracer{log: log, now: now, last: map[string]time.Time{}}
}

func (t *connTracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}

func (t *connTracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	if data.Err == nil || errors.Is(data.Err, context.Canceled) {
		return
	}
	cause, msg := "unreachable", "postgres: a connection could not be made: reads that need the database are refused (503) until it answers"
	var pgErr *pgconn.PgError
	if errors.As(data.Err, &pgErr) {
		cause = pgErr.Code
		msg = "postgres: the server refused a connection: reads that need the database are refused (503) until it accepts one"
		if pgErr.Code == "53300" { // too_many_connections
			msg = "postgres: PostgreSQL refuses new connections: too many clients (max_connections reached); " +
				"reads that need a new connection are refused (503) until connections free up: keep instances x (storage.postgres_max_connections + 1) " +
				"within max_connections less the reserved ones (config check counts them)"
		}
	}
	now := t.now()
	t.mu.Lock()
	last, seen := t.last[cause]
	if seen && now.Sub(last) < connLogEvery {
		t.mu.Unlock()
		return
	}
	t.last[cause] = now
	t.mu.Unlock()
	t.log.Warn(msg, "err", data.Err, "next_log_within", connLogEvery)
}

// TraceQueryStart and TraceQueryEnd make connTracer a pgx.QueryTracer,
// the type of ConnConfig.Tracer; queries are not traced.
func (t *connTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *connTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
