package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Operator changes reach every instance through PostgreSQL's LISTEN/NOTIFY:
// the transaction that makes a change (a key created or revoked, a user
// banned or moved to another plan, a flag set) also queues a notification
// on ChangesChannel, which the server delivers to every listener when, and
// only if, the transaction commits. A listener that lost its connection
// may have missed some: after each connection it is told to resync
// (KindResync) and reads everything again.
const ChangesChannel = "breakwater_changes"

// The kinds of change a notification names; its id is a key id, a user id
// or a flag name.
const (
	KindKey  = "key"
	KindUser = "user"
	KindFlag = "flag"
	// KindResync tells a listener that it (re)connected and may have
	// missed changes: it should reload every key, user and flag.
	KindResync = "resync"
)

// Listener reconnection backoff: the first wait, doubled up to the last.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// Notify tells every listening instance that the record id of kind
// changed, in a transaction of its own: for a change made outside this
// package's transactions. Changes made here notify inside their own
// transaction.
func (db *DB) Notify(ctx context.Context, kind, id string) error {
	if _, err := db.pool.Exec(ctx, "SELECT pg_notify($1, $2)", ChangesChannel, kind+":"+id); err != nil {
		return fmt.Errorf("notify %s %s: %w", kind, id, err)
	}
	return nil
}

// notifyTx queues the notification in tx: it is delivered if tx commits.
func notifyTx(ctx context.Context, tx pgx.Tx, kind, id string) error {
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", ChangesChannel, kind+":"+id); err != nil {
		return fmt.Errorf("notify %s %s: %w", kind, id, err)
	}
	return nil
}

// Listen calls fn with each change any instance (this one included)
// notifies, until ctx ends, and returns ctx's error. It holds a connection
// of its own, outside the pool. When the connection fails it reconnects
// with a backoff (100 ms doubling to 5 s); after each connection,
// the first included (a change made between the caller's load and the
// LISTEN would be missed otherwise), it calls fn(KindResync, ""). fn runs
// on Listen's goroutine: a slow fn delays the next notification, not
// another instance. Close does not end Listen: cancel ctx first.
func (db *DB) Listen(ctx context.Context, fn func(kind, id string)) error {
	wait := listenBackoffMin
	for {
		err := db.listenOnce(ctx, fn, func() { wait = listenBackoffMin })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		db.log.Warn("postgres change listener lost its connection; reconnecting", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, listenBackoffMax)
	}
}

// listenOnce connects, listens and hands fn every notification until the
// connection fails; connected is called once it listens.
func (db *DB) listenOnce(ctx context.Context, fn func(kind, id string), connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, db.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+ChangesChannel); err != nil {
		return err
	}
	connected()
	fn(KindResync, "")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		kind, id, ok := strings.Cut(n.Payload, ":")
		if !ok {
			db.log.Warn("postgres change notification without a kind", "payload", n.Payload)
			continue
		}
		fn(kind, id)
	}
}
