package postgres_test

import (
	"breakwater/server/api"
	"breakwater/server/guard/state"
	"breakwater/server/operator"
	"breakwater/storage/postgres"
)

// The interfaces of packages storage/postgres may not import (the HTTP
// edge, the operator, the write-behind) are asserted here; those of the
// packages it may import are asserted beside their methods. state.LayerStore
// needs the money path's reads as well (QuotaUsed, Budget, BudgetMonth,
// LatestBudgetDay, budget.Ledger), and api.CommitCounter the usage
// writer's counts: the money path's.
var (
	_ api.AnswerStore      = (*postgres.DB)(nil)
	_ operator.Store       = (*postgres.DB)(nil)
	_ operator.RecordStore = (*postgres.DB)(nil)
	_ state.StateStore     = (*postgres.DB)(nil)
	_ state.StateLoader    = (*postgres.DB)(nil)
)
