// Package failpoint marks the places in the request path where a crash
// matters most, so that the crash loop (test/crashloop) can kill the
// process exactly there.
//
// In the default build Hit is an empty function the compiler removes. Built
// with -tags failpoint, Hit reads BREAKWATER_FAILPOINT once, in the form
// NAME or NAME:PROBABILITY (a probability in (0, 1], default 1), and when
// the named point is hit and the draw fires it kills its own process with
// SIGKILL: no deferred function, no shutdown, no flush runs, as in a real
// crash. It refuses to do anything else: no delays, no errors injected.
package failpoint

// Env is the environment variable that arms a failpoint in a build with
// -tags failpoint.
const Env = "BREAKWATER_FAILPOINT"

// The failpoints of the request path.
const (
	// Reserved is hit right after the budget reservation was committed
	// and before the upstream call.
	Reserved = "reserved"
	// Recorded is hit right after the usage record was committed and
	// before the answer is written.
	Recorded = "recorded"
)
