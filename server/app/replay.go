package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"breakwater/server/guard/replay"
	"breakwater/server/operator"
	"breakwater/server/routes"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

// ReplayLimits are c's limits as a replay applies them: layer 1, each
// plan's daily line, the invite IP rate limit and each guarded route's
// rate, burst and daily line.
func (c Config) ReplayLimits() replay.Limits {
	lines := make(map[string]int64, len(c.Plans))
	for name, p := range c.Plans {
		lines[name] = p.DailyAttempts
	}
	rs := make(map[string]replay.RouteLimits, len(c.Routes))
	for _, r := range c.Routes {
		r = r.WithDefaults()
		rs[r.Name] = replay.RouteLimits{ByIP: r.Identity == routes.IdentityIP, Limits: r.Limits(), Daily: r.Daily}
	}
	return replay.Limits{User: c.Limits.User, Lines: lines, Invites: c.Invites.Limits(), Routes: rs}
}

// OpenRecorded reaches the statistics for a replay or the threshold
// figures without writing anything: on bolt the database opened read only
// if no server holds it, else the server's admin API; on postgres the
// shared database, which holds the events of every instance. The returned
// func closes the database.
func OpenRecorded(cfg Config, opts Options) (operator.Records, func(), error) {
	opts = opts.withDefaults()
	loc, _ := cfg.Budget.Location() // checked by Load
	if cfg.Storage.Backend == storage.BackendPostgres {
		return openRecordedPostgres(cfg, opts, loc)
	}
	db, err := storage.Open(cfg.Storage.Path, storage.Options{Timeout: operatorLockTimeout, Logger: opts.Logger, ReadOnly: true})
	switch {
	case errors.Is(err, storage.ErrLocked):
		token := opts.Getenv("BREAKWATER_ADMIN_TOKEN")
		if token == "" {
			return operator.Records{}, nil, fmt.Errorf("the server is running and holds %s: set BREAKWATER_ADMIN_TOKEN so this command can use its admin API at %s", cfg.Storage.Path, cfg.Server.AdminListen)
		}
		return operator.Records{RecordReader: operator.NewAdminClient(cfg.Server.AdminListen, token)}, func() {}, nil
	case errors.Is(err, storage.ErrNoDatabase):
		return operator.Records{}, nil, fmt.Errorf("no database at %s: check storage.path in config.toml (a relative path is taken from the config file's folder)", cfg.Storage.Path)
	case err != nil:
		return operator.Records{}, nil, err
	}
	return operator.Records{RecordReader: operator.Stored{Store: db, Loc: loc}}, func() {
		if err := db.Close(); err != nil {
			opts.Logger.Error("close database", "err", err)
		}
	}, nil
}

// openRecordedPostgres is OpenRecorded on postgres: the service's events,
// written by every instance, read from the shared database, as the
// operator's other commands read it while the instances serve.
func openRecordedPostgres(cfg Config, opts Options, loc *time.Location) (operator.Records, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), postgresOpenTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, opts.Getenv(postgres.EnvURL), postgres.Options{Logger: opts.Logger, Now: opts.Now, MaxConns: int32(cfg.Storage.PostgresMaxConnections)})
	if err != nil {
		return operator.Records{}, nil, err
	}
	return operator.Records{RecordReader: operator.Stored{Store: db, Loc: loc}}, func() {
		if err := db.Close(); err != nil {
			opts.Logger.Error("close database", "err", err)
		}
	}, nil
}
