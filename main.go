// Command breakwater runs a pay-per-use OCR API on the public internet
// without letting the bill run away. See README.md.
//
// main only calls run; run sets up the signals and hands the command line
// to server/cli, whose commands build the service through server/app.
package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"breakwater/server/cli"
)

// shippedConfig is the commented default config, for config init.
//
//go:embed config.toml
var shippedConfig []byte

func init() { cli.ShippedConfig = shippedConfig }

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	os.Exit(exitCode(err, os.Stderr))
}

// run is the whole program: SIGINT and SIGTERM end ctx, which stops serve
// and demo in order.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return cli.Run(ctx, args, getenv, stdout, stderr)
}

// exitCode prints err once on stderr and gives the exit status: 0 ok,
// 1 error, 2 a command line that could not be understood.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "breakwater:", err)
	if errors.Is(err, cli.ErrUsage) {
		return 2
	}
	return 1
}
