package postgres

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A connection refused again and again is logged once a minute per
// cause, by the injected clock; another cause is logged at once.
func TestRefusedConnectionsLoggedOnceAMinute(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	tr := newConnTracer(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	full := &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: "sorry, too many clients already"}
	refuse := func(err error) { tr.TraceConnectEnd(context.Background(), pgx.TraceConnectEndData{Err: err}) }
	for range 100 {
		refuse(full)
		now = now.Add(500 * time.Millisecond) // 50 s in all
	}
	refuse(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))
	if n := strings.Count(buf.String(), "too many clients (max_connections reached)"); n != 1 {
		t.Fatalf("100 refusals within 50 s logged %d times, want once:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "could not be made"); n != 1 {
		t.Fatalf("another cause logged %d times, want once:\n%s", n, buf.String())
	}
	now = now.Add(10 * time.Second) // a minute after the first
	refuse(full)
	if n := strings.Count(buf.String(), "too many clients (max_connections reached)"); n != 2 {
		t.Fatalf("a refusal a minute later logged: %d lines in all, want 2:\n%s", n, buf.String())
	}
}
