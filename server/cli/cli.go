// Package cli is breakwater's command line: one cobra command per
// operation, each with its own flags, one file per group of commands
// (serve, demo, keys, users, invites, usage and the budget, backup,
// detect, config, version). It parses and prints; the work goes through
// server/app, which owns the wiring: serve and demo open an app.App, the
// operator's commands an operator.Service (the admin API while the server
// runs, the database while it is stopped).
//
// It refuses to guess: an unknown command, flag or argument is a usage
// error (ErrUsage, exit 2) that names it and prints that command's usage,
// never another command's.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"breakwater/server/app"
	"breakwater/server/operator"
)

// DefaultConfigPath is where --config looks when it is not given.
const DefaultConfigPath = "config.toml"

// ErrUsage marks a command line that could not be understood: an unknown
// command or flag, a missing or extra argument, a bad flag value. The
// caller exits with status 2.
var ErrUsage = errors.New("usage")

// usageError is a usage error of one command, whose usage Run prints.
type usageError struct {
	cmd *cobra.Command // nil: print no usage
	err error
}

func (e *usageError) Error() string        { return e.err.Error() }
func (e *usageError) Unwrap() error        { return e.err }
func (e *usageError) Is(target error) bool { return target == ErrUsage }

// usageErrorf makes a usage error of c, its message prefixed with c's
// name as the user typed it ("keys revoke: ..."). A usage error of the
// root prints no usage: that would be every command's.
func usageErrorf(c *cobra.Command, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if !c.HasParent() {
		return &usageError{err: fmt.Errorf("%s (breakwater help lists the commands)", msg)}
	}
	return &usageError{cmd: c, err: fmt.Errorf("%s: %s", name(c), msg)}
}

// name is c's path below the root: "keys revoke".
func name(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
}

// env is what every command reads: the environment, where it prints, and
// the root's --config.
type env struct {
	getenv         func(string) string
	stdout, stderr io.Writer
	config         string
	now            func() time.Time // names dated backups
	shipped        []byte           // the default config, which config init writes
}

// Run parses args (without the program's name) and runs the command they
// name; no command means serve. ctx ends serve and demo. Help goes to
// stdout; a usage error prints the command's usage on stderr and returns
// an error that matches ErrUsage. Run never prints the error it returns:
// the caller prints it once (ExitCode does). shipped is the commented
// default config.toml, which config init writes: main embeds the
// repository's.
func Run(ctx context.Context, shipped []byte, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	root := newRoot(&env{getenv: getenv, stdout: stdout, stderr: stderr, now: time.Now, shipped: shipped})
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if ue := (*usageError)(nil); errors.As(err, &ue) && ue.cmd != nil {
		fmt.Fprint(stderr, ue.cmd.UsageString())
	}
	return err
}

// ExitCode prints err once on stderr and gives the exit status: 0 ok,
// 1 error, 2 a command line that could not be understood (ErrUsage), 3 a
// reconciliation beyond reconcile.max_drift (ErrDrift).
func ExitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "breakwater:", err)
	switch {
	case errors.Is(err, ErrUsage):
		return 2
	case errors.Is(err, ErrDrift):
		return 3
	}
	return 1
}

// newRoot builds the command tree.
func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "breakwater [--config FILE]",
		Short: "a pay-per-use OCR API on the public internet, without the bill running away",
		Long: `Breakwater puts a pay-per-use OCR API on the public internet without letting
the bill run away. With no command it serves, as "breakwater serve".`,
		Args:          rootArgs,
		RunE:          e.serve,
		SilenceErrors: true, // Run's caller prints the error, once
		SilenceUsage:  true, // Run prints the usage of usage errors only
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.PersistentFlags().StringVar(&e.config, "config", DefaultConfigPath, "read the config from `FILE`")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErrorf(c, "%v", err) })
	defaultUsage := root.UsageFunc()
	root.SetUsageFunc(func(c *cobra.Command) error {
		if c.HasParent() && c.HasAvailableSubCommands() {
			return groupUsage(c)
		}
		return defaultUsage(c)
	})

	root.AddGroup(
		&cobra.Group{ID: "service", Title: "Run the service:"},
		&cobra.Group{ID: "operator", Title: "Operate it (through the admin API while serving, the database while stopped):"},
		&cobra.Group{ID: "other", Title: "Other commands:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("service", serveCmd(e), demoCmd(e), selftestCmd(e))
	add("operator", keysCmd(e), usersCmd(e), invitesCmd(e), usageCmd(e), budgetCmd(e), brakeCmd(e), backupCmd(e), detectCmd(e), cooldownsCmd(e),
		replayCmd(e), thresholdsCmd(e), reconcileCmd(e))
	add("other", alertsCmd(e), configCmd(e), migrateCmd(e), versionCmd(e))
	root.SetHelpCommandGroupID("other")
	root.SetCompletionCommandGroupID("other")
	adoptDefaults(root)
	finish(root)
	return root
}

// finish keeps cobra from adding "[flags]" to the usage lines, which name
// their flags themselves, and gives every command its -h now, so that
// "help CMD" shows it as "CMD -h" does.
func finish(c *cobra.Command) {
	c.DisableFlagsInUseLine = true
	c.InitDefaultHelpFlag()
	for _, sub := range c.Commands() {
		finish(sub)
	}
}

// adoptDefaults makes cobra's help and completion commands behave like
// the others: a one-line summary in the same voice, and an unknown help
// topic or a missing shell a usage error rather than help and success.
func adoptDefaults(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Short = "print the list of commands, or one command's help"
			c.Run = nil
			c.RunE = func(c *cobra.Command, args []string) error {
				cmd, rest, err := c.Root().Find(args)
				switch {
				case err != nil:
					return usageErrorf(c.Root(), "help: %v", err)
				case len(rest) > 0:
					return usageErrorf(cmd, "unknown command %q", rest[0])
				}
				return cmd.Help()
			}
		case "completion":
			c.Short = "print a shell completion script: bash, zsh, fish or powershell"
			c.Args, c.RunE = groupArgs, missingCommand
		}
	}
}

// rootArgs refuses an unknown command: with no command the root serves,
// so any argument left to it is a command that does not exist.
func rootArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf(c, "unknown command %q", args[0])
	}
	return nil
}

// group makes a command that only holds commands (keys, users, ...): on
// its own, or with an unknown command, it is a usage error.
func group(use, short string, cmds ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{Use: use, Short: short, Args: groupArgs, RunE: missingCommand}
	g.AddCommand(cmds...)
	return g
}

// groupArgs refuses an argument left to a group: a command it does not
// hold.
func groupArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf(c, "unknown command %q", args[0])
	}
	return nil
}

// missingCommand is what a group does on its own.
func missingCommand(c *cobra.Command, _ []string) error {
	return usageErrorf(c, "missing command")
}

// groupUsage is the usage of a group: the commands it holds, as a group
// does nothing by itself.
func groupUsage(c *cobra.Command) error {
	w := c.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s COMMAND\n\nCommands:\n", c.CommandPath())
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			fmt.Fprintf(w, "  %-*s %s\n", sub.NamePadding(), sub.Name(), sub.Short)
		}
	}
	if flags := c.InheritedFlags(); flags.HasAvailableFlags() {
		fmt.Fprintf(w, "\nGlobal Flags:\n%s", flags.FlagUsages())
	}
	fmt.Fprintf(w, "\nUse \"%s COMMAND --help\" for more information about a command.\n", c.CommandPath())
	return nil
}

// positional checks a command's positional arguments against names, the
// first required of which are required ("usage [ID]": 0, "ID").
func positional(required int, names ...string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		switch {
		case len(args) < required:
			return usageErrorf(c, "missing %s", strings.Join(names[len(args):required], " "))
		case len(args) > len(names):
			return usageErrorf(c, "unexpected argument %q", args[len(names)])
		}
		return nil
	}
}

// idArg is the check of a command that takes one id of kind (an
// operator.Kind*), named name in its usage: an id that is not text (a
// NUL, bytes that are no UTF-8, a control character) is a usage error,
// refused before the command reaches the service (operator.CheckID).
func idArg(kind, name string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := positional(1, name)(c, args); err != nil {
			return err
		}
		if err := operator.CheckID(kind, args[0]); err != nil {
			return usageErrorf(c, "%v", err)
		}
		return nil
	}
}

// noArgs is the check of a command that takes no positional argument.
var noArgs = positional(0)

// operate runs f on the service that --config names: through the admin
// API while it serves, on the database while it is stopped. A database
// that is not there is not made (see operateOrCreate).
func (e *env) operate(f func(op operator.Service) error) error { return e.operateOn(false, f) }

// operateOrCreate is operate for the one command that may start a fresh
// install's database: keys create.
func (e *env) operateOrCreate(f func(op operator.Service) error) error { return e.operateOn(true, f) }

func (e *env) operateOn(create bool, f func(op operator.Service) error) error {
	c, err := e.loadForOperator()
	if err != nil {
		return err
	}
	op, closeOp, err := app.OpenOperator(c, app.Options{Getenv: e.getenv, CreateDatabase: create})
	if err != nil {
		return err
	}
	defer closeOp()
	return f(op)
}

// loadForOperator reads --config for an operator's command: leniently, so
// that a typo elsewhere in the file cannot lock the operator out of the
// brake; each key left out is named on stderr.
func (e *env) loadForOperator() (app.Config, error) {
	c, warnings, err := app.LoadForOperator(e.config, e.getenv)
	for _, w := range warnings {
		fmt.Fprintln(e.stderr, "breakwater: warning:", w)
	}
	return c, err
}
