// Package failover holds the tests of a failover of PostgreSQL under
// load: two real breakwater binaries on a multi-host URL, a primary and a
// streaming standby on loopback (synchronous, then asynchronous), the
// primary killed (kill -9) and the standby promoted. A fake Gemini, behind
// a proxy that counts each image it is sent, is the upstream; clients send
// every request with an Idempotency-Key and retry it on failure.
package failover

import (
	"fmt"
	"os"
	"testing"

	"breakwater/storage/postgres/pgtest"
	"breakwater/test/harness"
)

// bin is the breakwater binary, built once for the package.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var done func()
	var err error
	if bin, done, err = harness.BuildForMain("failover"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer done()
	return pgtest.Main(m)
}
