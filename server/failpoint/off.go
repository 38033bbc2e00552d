//go:build !failpoint

package failpoint

// Enabled reports whether this build has failpoints compiled in.
const Enabled = false

// Hit does nothing in a build without -tags failpoint.
func Hit(name string) {}
