// Package e2e holds the tests that build the breakwater binary from the
// module's root and run it whole.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// TestMain runs the tests from the module's root, which they build.
func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	root, err := harness.ModuleRoot(ctx)
	cancel()
	if err == nil {
		err = os.Chdir(root)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(pgtest.Main(m)) // stops the cluster a test started, if any
}
