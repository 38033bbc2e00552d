package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the release, set at build time with
// -ldflags "-X breakwater/server/cli.Version=v1.2.3". Without it the
// module's own version from the build information is shown: for a build
// from a git checkout a pseudo-version from the commit
// (v0.0.0-TIME-REVISION, with +dirty for uncommitted changes), else
// "(devel)".
var Version = "dev"

func versionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version and the commit it was built from",
		Long: `Print the version, and from the build information Go records: the commit
(vcs.revision), its time (vcs.time), whether the checkout had uncommitted
changes (vcs.modified), and the Go version. A build from a git checkout
records the commit; a build from a linked worktree, or with -buildvcs=false,
records none.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			readBuild().print(e.stdout)
			return nil
		},
	}
}

// build is what a binary knows of its own build.
type build struct {
	version  string // Version, or the module's version
	revision string // vcs.revision, "" when none was recorded
	time     string // vcs.time (RFC 3339)
	modified string // vcs.modified: "true" or "false"
	goVer    string
}

// readBuild reads the binary's build information.
func readBuild() build {
	b := build{version: Version, goVer: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if b.version == "dev" && info.Main.Version != "" {
		b.version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.time":
			b.time = s.Value
		case "vcs.modified":
			b.modified = s.Value
		}
	}
	return b
}

// print writes the version command's lines.
func (b build) print(w io.Writer) {
	fmt.Fprintln(w, "breakwater", b.version)
	if b.revision == "" {
		fmt.Fprintln(w, "revision: unknown (built without VCS information)")
	} else {
		fmt.Fprintln(w, "revision:", b.revision)
		fmt.Fprintln(w, "time:    ", b.time)
		fmt.Fprintln(w, "modified:", b.modified)
	}
	fmt.Fprintln(w, "go:      ", b.goVer)
}

// logArgs are the log's attributes of the build: version, and revision
// and modified when recorded.
func (b build) logArgs() []any {
	args := []any{"version", b.version}
	if b.revision != "" {
		args = append(args, "revision", b.revision, "modified", b.modified)
	}
	return args
}
