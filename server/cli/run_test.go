package cli_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"breakwater/server/cli"
	"breakwater/storage/postgres/pgtest"
)

// The command tests of this package run the command line as the binary
// does, with the config the binary ships, from the module's root: they
// read config.toml and the README there, as an operator would.

// childArgs, when set in the environment, makes the test binary run
// breakwater itself instead of the tests (TestMain): TestExitCodes reads
// that child's exit status and stderr.
const childArgs = "BREAKWATER_TEST_CHILD_ARGS"

// moduleRoot is the module's root, seen from this package's folder.
var moduleRoot = filepath.Join("..", "..")

// shippedConfig is the repository's config.toml, which main embeds and
// hands to the command line; TestMain reads it.
var shippedConfig []byte

// TestMain makes the module's root the working directory of the tests.
// When childArgs is set in the environment, the test binary runs
// breakwater itself instead of the tests, as main does.
func TestMain(m *testing.M) {
	args := os.Getenv(childArgs)
	if args == "" { // a child starts in its parent's folder, the root
		if err := os.Chdir(moduleRoot); err != nil {
			panic(err)
		}
	}
	var err error
	if shippedConfig, err = os.ReadFile("config.toml"); err != nil {
		panic(err)
	}
	if args != "" {
		err := run(context.Background(), strings.Fields(args), os.Getenv, os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode(err, os.Stderr)) // as main does
	}
	os.Exit(pgtest.Main(m)) // stops the PostgreSQL cluster a test started
}

// run runs the command line as main does, with the shipped config.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return cli.Run(ctx, shippedConfig, args, getenv, stdout, stderr)
}
