package postgres

import (
	"context"
	"fmt"
	"time"

	"breakwater/detect"
)

var _ detect.Elector = (*DB)(nil)

// detectLock is the advisory lock key whose holder runs the daily
// detection of the service ("breakdet" in ASCII); migrationLock is
// another key.
const detectLock int64 = 0x627265616b646574

// LeadDetection makes this instance the one that runs the daily detection
// while it holds the session advisory lock detectLock, on a connection it
// keeps from the pool until release: another instance that tries
// meanwhile gets ok false. If the process dies, its session ends and the
// lock with it; what the run had not stored (the run record is written
// last, with the day's findings) is run again by the next instance that
// leads.
func (db *DB) LeadDetection(ctx context.Context) (release func(), ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("lead detection: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, detectLock).Scan(&ok); err != nil || !ok {
		conn.Release()
		if err != nil {
			return nil, false, fmt.Errorf("lead detection: %w", err)
		}
		return nil, false, nil
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var unlocked bool
		if err := conn.QueryRow(uctx, `SELECT pg_advisory_unlock($1)`, detectLock).Scan(&unlocked); err != nil || !unlocked {
			// The session may still hold the lock: end it rather than
			// give the pool a connection that keeps the lead.
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}, true, nil
}
