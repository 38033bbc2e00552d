package app

import (
	"time"

	"breakwater/detect"
	"breakwater/server/admin"
	"breakwater/server/api"
	"breakwater/server/guard"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/server/operator"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

// Backend is the database an App runs on, bolt's one file or a
// PostgreSQL database shared by several instances: every interface of
// docs/DESIGN.md's "What a storage backend implements" but the money
// path's (the usage records and the budget's ledger, which the App takes
// apart: on postgres they are postgres.Money), and the few calls of the
// wiring itself.
type Backend interface {
	keys.KeyStore
	invites.Store
	invites.Redeemer
	detect.EventWriter
	detect.Store
	detect.AlertStore
	detect.PersonalPruner
	api.AnswerStore
	state.StateLoader
	state.StateStore
	operator.Store
	operator.RecordStore

	// Flag reads an operator switch (the brake) at start.
	Flag(name string) (bool, error)
	// PruneAnswers deletes kept answers past their time.
	PruneAnswers(idempotencyBefore, dedupeBefore time.Time) (int, error)
	// RekeyInvites re-keys the stored hashes of invite codes when the
	// server secret changes.
	RekeyInvites(mark []byte, rekey func(digest [32]byte) [32]byte) (int, error)
	Close() error
}

// Both backends are the whole seam; on bolt the money path is the DB too.
var (
	_ Backend             = (*storage.DB)(nil)
	_ Backend             = (*postgres.DB)(nil)
	_ guard.UsageRecorder = (*storage.DB)(nil)
	_ guard.UsageRecorder = (*postgres.Money)(nil)
	_ api.CommitCounter   = (*storage.DB)(nil)
	_ api.CommitCounter   = (*postgres.Money)(nil)
	_ api.AnswerClaimer   = (*postgres.DB)(nil) // keys in flight across instances
	// the service's refusals, beside the instance's
	_ admin.ServiceRefusalReader = (*postgres.DB)(nil)
)
