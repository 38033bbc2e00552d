// Package failover holds the tests of a failover of PostgreSQL under
// load: two real breakwater binaries on a multi-host URL, a primary and a
// streaming standby on loopback (synchronous, then asynchronous), the
// primary killed (kill -9) and the standby promoted. A fake Gemini, behind
// a proxy that counts each image it is sent, is the upstream; clients send
// every request with an Idempotency-Key and retry it on failure.
package failover

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// bin is the breakwater binary, built once for the package.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := harness.ModuleRoot(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "breakwater-failover-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bin, err = harness.Build(ctx, root, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Chdir(root); err != nil { // harness.NewGemini reads ocr/testdata from here
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return pgtest.Main(m)
}
