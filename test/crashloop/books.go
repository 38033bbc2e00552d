package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

// Backends the loop runs on (storage.backend).
const (
	backendBolt     = "bolt"
	backendPostgres = "postgres"
)

// books is what the checks read of the stopped server's records, on
// either backend.
type books interface {
	Usage(from, to time.Time) ([]budget.UsageRecord, error)
	QuotaUsed(month string) (map[string]int64, error)
	LedgerCalls(day string) (int64, error)
	OpenReservations() (int, error)
	Close() error
}

// openBooks opens the records of the loop's backend. On bolt the open
// runs bbolt's consistency check over every page.
func (l *loop) openBooks() (books, error) {
	if l.o.Backend == backendPostgres {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := waitSessionsEnded(ctx, l.o.PostgresURL); err != nil {
			return nil, err
		}
		db, err := postgres.Open(ctx, l.o.PostgresURL, postgres.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return nil, err
		}
		return pgBooks{db}, nil
	}
	db, err := storage.Open(l.dbPath, storage.Options{
		Timeout: 5 * time.Second,
		Check:   true, // bbolt's tx.Check over every page
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	return boltBooks{db}, nil
}

type boltBooks struct{ *storage.DB }

func (b boltBooks) LedgerCalls(day string) (int64, error) {
	t, err := b.Budget(day)
	return t.Requests, err
}

// pgBooks reads the shared database directly: the checker is no instance
// of the service, and takes no part in its money path.
type pgBooks struct{ *postgres.DB }

func (b pgBooks) QuotaUsed(month string) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := b.Pool().Query(ctx, "SELECT user_id, used FROM quota_counts WHERE month = $1", month)
	if err != nil {
		return nil, fmt.Errorf("quota used %s: %w", month, err)
	}
	defer rows.Close()
	used := map[string]int64{}
	for rows.Next() {
		var user string
		var n int64
		if err := rows.Scan(&user, &n); err != nil {
			return nil, err
		}
		used[user] = n
	}
	return used, rows.Err()
}

func (b pgBooks) LedgerCalls(day string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var calls int64
	err := b.Pool().QueryRow(ctx, "SELECT calls FROM ledger_days WHERE day = $1", day).Scan(&calls)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return calls, err
}

// OpenReservations is 0: a lease keeps no row of its own on postgres.
func (pgBooks) OpenReservations() (int, error) { return 0, nil }

// waitSessionsEnded waits until no other session is connected to the
// database at url: a killed server's sessions may still be running what
// it sent before it died (a group transaction sent whole is committed by
// PostgreSQL all the same), and the checks must read the books after
// those commits, not between two of their reads.
func waitSessionsEnded(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("books: %w", err)
	}
	defer conn.Close(context.Background())
	for {
		var others int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&others)
		switch {
		case err != nil:
			return fmt.Errorf("books: the killed server's sessions: %w", err)
		case others == 0:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("books: %d sessions of the killed server still connected: %w", others, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
