package app

import (
	"breakwater/server/api"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/server/operator"
	"breakwater/storage"
)

// What the App hands the database as, beyond what storage guards itself
// (the interfaces of budget, detect, server/keys and server/invites, in
// storage/storage.go): the interfaces of the packages storage may not
// import, the HTTP edge's, the guard's, its state's and the operator's.
// With those, this is the whole seam a second backend implements
// (docs/DESIGN.md, "What a storage backend implements").
var (
	_ guard.UsageRecorder  = (*storage.DB)(nil)
	_ state.LayerStore     = (*storage.DB)(nil)
	_ state.StateStore     = (*storage.DB)(nil)
	_ state.StateLoader    = (*storage.DB)(nil)
	_ operator.Store       = (*storage.DB)(nil)
	_ operator.RecordStore = (*storage.DB)(nil)
	_ api.AnswerStore      = (*storage.DB)(nil)
	_ api.CommitCounter    = (*storage.DB)(nil)
)
