package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commandsOf lists c and every command below it that a user can call.
func commandsOf(c *cobra.Command) []*cobra.Command {
	all := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() || sub.Name() == "help" {
			all = append(all, commandsOf(sub)...)
		}
	}
	return all
}

// TestEveryCommandHasItsOwnHelp: each command, down the whole tree, has a
// summary, and its -h exits cleanly with its usage line and every one of
// its own flags, and --config.
func TestEveryCommandHasItsOwnHelp(t *testing.T) {
	root := newRoot(&env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard})
	cmds := commandsOf(root)
	if len(cmds) < 25 {
		t.Fatalf("only %d commands found", len(cmds))
	}
	for _, c := range cmds {
		path := strings.Fields(name(c))
		if !c.HasParent() {
			path = nil
		}
		t.Run(strings.Join(append([]string{"breakwater"}, path...), " "), func(t *testing.T) {
			if c.Short == "" {
				t.Error("no summary")
			}
			var out, errOut bytes.Buffer
			err := Run(context.Background(), nil, append(path, "-h"), func(string) string { return "" }, &out, &errOut)
			if err != nil || errOut.Len() != 0 {
				t.Fatalf("-h: %v\n%s", err, errOut.String())
			}
			help := out.String()
			if !strings.Contains(help, "Usage:\n  "+c.CommandPath()) || !strings.Contains(help, "--config FILE") {
				t.Errorf("-h printed:\n%s", help)
			}
			c.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if !strings.Contains(help, "--"+f.Name) {
					t.Errorf("-h does not show its flag --%s:\n%s", f.Name, help)
				}
			})
		})
	}
}
