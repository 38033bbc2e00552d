// Command breakwater runs a pay-per-use OCR API on the public internet
// without letting the bill run away. See README.md.
//
// main only calls run; run sets up the signals and hands the command line
// to server/cli, whose commands build the service through server/app.
package main

import (
	"context"
	_ "embed"
	"io"
	"os"
	"os/signal"
	"syscall"

	"breakwater/server/cli"
)

// shippedConfig is the commented default config, which config init
// writes; run hands it to the command line.
//
//go:embed config.toml
var shippedConfig []byte

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	os.Exit(cli.ExitCode(err, os.Stderr))
}

// run is the whole program: SIGINT and SIGTERM end ctx, which stops serve
// and demo in order.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return cli.Run(ctx, shippedConfig, args, getenv, stdout, stderr)
}
