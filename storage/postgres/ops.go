package postgres

import (
	"sync"
	"sync/atomic"
)

// records is an instance's own part of the records: its name in the claims
// of idempotency keys, and the counts of the writer's commits.
type records struct {
	ownerOnce sync.Once
	owner     string
	txs       atomic.Int64
	writes    atomic.Int64
}

// ownerID is this instance's name in answer claims, made at first use.
func (r *records) ownerID() string {
	r.ownerOnce.Do(func() { r.owner = newOwnerID() })
	return r.owner
}

// countCommit counts one transaction of the usage writer (the group
// commit) and the writes it carried: what Transactions and Writes report.
func (db *DB) countCommit(writes int) {
	db.rec.txs.Add(1)
	db.rec.writes.Add(int64(writes))
}

// Transactions is how many transactions this instance's usage writer
// committed (api.CommitCounter). Each instance counts its own; the
// database's own count is pg_stat_database.xact_commit.
func (db *DB) Transactions() int64 { return db.rec.txs.Load() }

// Writes is how many writes those transactions carried.
func (db *DB) Writes() int64 { return db.rec.writes.Load() }
