package postgres_test

import (
	"testing"

	"breakwater/server/api"
	"breakwater/server/guard/state"
	"breakwater/server/operator"
	"breakwater/storage/postgres"
)

// The interfaces of packages storage/postgres may not import (the HTTP
// edge, the operator, the write-behind) are asserted here; those of the
// packages it may import are asserted beside their methods. state.LayerStore
// needs the money path's reads as well (QuotaUsed, Budget, BudgetMonth,
// LatestBudgetDay, budget.Ledger).
var (
	_ api.AnswerStore      = (*postgres.DB)(nil)
	_ api.CommitCounter    = (*postgres.DB)(nil)
	_ operator.Store       = (*postgres.DB)(nil)
	_ operator.RecordStore = (*postgres.DB)(nil)
	_ state.StateStore     = (*postgres.DB)(nil)
	_ state.StateLoader    = (*postgres.DB)(nil)
)

// The commit counts are this instance's usage writer's.
func TestCommitCounter(t *testing.T) {
	db := newDB(t)
	if db.Transactions() != 0 || db.Writes() != 0 {
		t.Fatalf("a new DB counts %d transactions, %d writes", db.Transactions(), db.Writes())
	}
	db.CountCommit(3)
	db.CountCommit(1)
	if db.Transactions() != 2 || db.Writes() != 4 {
		t.Errorf("after two commits of 3 and 1 writes: %d transactions, %d writes", db.Transactions(), db.Writes())
	}
}
