package cli

import (
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"breakwater/server/app"
)

func serveCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "run the service (the default)",
		Long: `Run the service until SIGINT or SIGTERM: in-flight requests finish, the
defense state is written, statistics are flushed and the database is closed.
SIGHUP, or saving the config file, reloads it.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              e.serve,
	}
}

// serve runs the service that --config describes until the command's
// context ends.
func (e *env) serve(c *cobra.Command, _ []string) error {
	app.HoldHeapFloor() // the collector's least room, for the life of the process
	cfg, err := app.Load(e.config, e.getenv)
	if err != nil {
		return err
	}
	log := newLogger(e.stderr)
	log.Info("breakwater", readBuild().logArgs()...)
	a, err := app.Open(c.Context(), cfg, app.Options{Getenv: e.getenv, Logger: log})
	if err != nil {
		return err
	}
	defer a.Close()
	a.Watch(c.Context(), e.config)
	return a.Wait(c.Context())
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
