package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"breakwater/detect"
	"breakwater/server"
	"breakwater/server/invites"
	"breakwater/server/keys"
	"breakwater/storage"
)

// Operator is what the operator's commands need: the running server's
// admin API (server.AdminClient) or, while the server is stopped, the same
// commands straight on the database (server.Operator).
type Operator interface {
	CreateKey(ctx context.Context, user, plan string) (string, keys.KeyInfo, error)
	ListKeys(ctx context.Context) ([]keys.KeyInfo, error)
	RevokeKey(ctx context.Context, id string) (keys.KeyInfo, error)
	SetBanned(ctx context.Context, user string, banned bool) (keys.UserInfo, error)
	SetPlan(ctx context.Context, user, plan string) (keys.UserInfo, error)
	Usage(ctx context.Context, user string) ([]server.UsageInfo, error)
	Budget(ctx context.Context) (server.BudgetInfo, error)
	SetBrake(ctx context.Context, on bool) (server.BudgetInfo, error)
	Backup(ctx context.Context, w io.Writer, target string) error
	CreateInvite(ctx context.Context, uses int, ttl time.Duration, note string) (string, invites.Info, error)
	ListInvites(ctx context.Context) ([]invites.Info, error)
	RevokeInvite(ctx context.Context, id string) (invites.Info, error)
	DeleteInvite(ctx context.Context, id string) (invites.Info, error)
	DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error)
}

var (
	_ Operator = (*server.Operator)(nil)
	_ Operator = (*server.AdminClient)(nil)
)

// operatorLockTimeout is how long an operator command waits for the
// database lock before it decides that the server holds it.
const operatorLockTimeout = 300 * time.Millisecond

// OpenOperator reaches the service for an operator command: the database
// directly, with the layers' state as the server would load it and the
// daily detection, if no server holds it; else the server's admin API.
// The returned func delivers the mail a command queued (the digest of
// detect run) and closes the database.
func OpenOperator(cfg Config, opts Options) (Operator, func(), error) {
	opts = opts.withDefaults()
	a := &App{opts: opts, log: opts.Logger, cfg: cfg}
	err := a.openState(cfg, operatorLockTimeout)
	if errors.Is(err, storage.ErrLocked) {
		a.Close()
		token := opts.Getenv("BREAKWATER_ADMIN_TOKEN")
		if token == "" {
			return nil, nil, fmt.Errorf("the server is running and holds %s: set BREAKWATER_ADMIN_TOKEN so this command can use its admin API at %s", cfg.Storage.Path, cfg.Server.AdminListen)
		}
		return server.NewAdminClient(cfg.Server.AdminListen, token), func() {}, nil
	}
	if err == nil {
		err = a.openOperator(cfg, &detect.Counters{})
	}
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a.operator, a.Close, nil
}

// openOperator builds, over the state openState loaded, the invites, the
// daily detection and the operator's commands on them.
func (a *App) openOperator(cfg Config, counters *detect.Counters) error {
	var err error
	if a.invites, err = invites.NewCodes(a.db, invites.Options{Now: a.opts.Now}); err != nil {
		return err
	}
	if err := a.openDetection(cfg, counters); err != nil {
		return err
	}
	loc, _ := cfg.Budget.Location() // checked by Load
	a.operator = server.NewOperator(a.keys, a.invites, a.layers, a.db, a.plans.All, loc)
	a.operator.SetDetection(a.detect)
	return nil
}
