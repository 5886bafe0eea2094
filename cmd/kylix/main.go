// Command kylix is the Kylix node and its command-line tool: import models and
// datasets into the content-addressed store, export them, inspect, verify and
// collect garbage, and (kylix serve) mount the namespace for unmodified
// programs.
//
// This package is flags, output, exit codes and wiring. The work is done by
// the packages beside it: the running node is package node (kylix serve
// wires a node.Config from its flags), and the other commands reach it
// through its admin socket (nodeclient.go). The command line follows the
// conventions of cobra/pflag (docs/design/cli.md): GNU-style flags anywhere
// on the line, help on stdout when asked and on stderr after a usage error,
// and the exit statuses below.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit statuses, documented in kylix --help and docs/design/cli.md.
const (
	exitOK          = 0   // success; also kylix alone, --help, --version
	exitFailure     = 1   // the command failed (the message says why), or verify/fsck found problems
	exitUsage       = 2   // unknown command or flag, wrong arguments
	exitInterrupted = 130 // stopped by Ctrl-C or SIGTERM (128+SIGINT)
)

const exitStatusDoc = `Exit status:
  0    success (also: kylix alone, --help, --version)
  1    failure: the message on stderr says what went wrong and what to do;
       verify and fsck: problems found (listed on stdout)
  2    usage error: unknown command or flag, wrong number of arguments
       (the message on stderr, and which --help to read)
  130  interrupted (Ctrl-C or SIGTERM)
`

// command is one subcommand. run returns an error to print; an exitError sets
// the exit status without printing more. run parses its own flags (newFlags):
// it receives every argument after the command name, and also the global
// flags (--data, --json) given before it.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// exitError carries an exit status for a failure already reported.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// runError is what a command's run returned, told apart from cobra's own
// errors (unknown command or flag before the command name: usage errors).
type runError struct{ err error }

func (r runError) Error() string { return r.err.Error() }
func (r runError) Unwrap() error { return r.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, newEnv(os.Stdin, os.Stdout, os.Stderr), os.Args[1:]))
}

// run executes one command line and returns the exit status. A node runs
// forwarded command lines through it too (nodeclient.go).
func run(ctx context.Context, e *env, args []string) int {
	if args == nil {
		args = []string{} // cobra would read os.Args for nil
	}
	e.ctx, e.args = ctx, args // for forwarding to a running node (nodeclient.go)
	root := newRoot(ctx, e)
	if len(args) > 0 && strings.HasPrefix(args[0], cobra.ShellCompRequestCmd) {
		addFlagsForCompletion(ctx, e, root)
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	var re runError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &re):
		return exitCode(ctx, e, re.err)
	}
	// cobra's own: an unknown command or flag, or arguments a built-in
	// command (help, completion) does not take.
	// One line saying what is wrong (cobra's suggestions of commands
	// after it), one saying where the usage is: a page of usage would
	// scroll the mistake away.
	if cmd == nil {
		cmd = root
	}
	fmt.Fprintf(e.stderr, "kylix: %s\n", cobraUsageError(root, cmd, err))
	if cmd == root {
		fmt.Fprintln(e.stderr, "Run 'kylix --help' for the commands and global flags.")
	} else {
		fmt.Fprintf(e.stderr, "Run '%s --help' for its usage.\n", cmd.CommandPath())
	}
	return exitUsage
}

// newRoot builds the command tree for one command line: each registered
// command becomes a cobra command that leaves flag parsing to its run (so
// its flags may come anywhere after its name), and the root knows the
// global flags, so they may come before the command name too.
func newRoot(ctx context.Context, e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "kylix",
		Short:         "kylix moves AI model weights and data from storage into GPU memory",
		Version:       buildVersion().String(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetVersionTemplate("kylix {{.Version}}\n")
	// Global flags: only so that they may come before the command name
	// (the command's own flag set parses them, wherever they are).
	root.Flags().String("data", e.defaultDataDir(), "data directory")
	root.Flags().Bool("json", false, "print JSON instead of text")
	// Defined now rather than when cobra runs the root, so that finding the
	// command name knows they take no value (kylix --help ls: ls's help).
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	root.SetUsageFunc(func(c *cobra.Command) error { // cobra's own commands: completion, help
		w := c.OutOrStderr()
		fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
		if c.HasAvailableSubCommands() {
			fmt.Fprintf(w, "  %s COMMAND\n\nCommands:\n", c.CommandPath())
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() {
					fmt.Fprintf(w, "  %-11s %s\n", sub.Name(), sub.Short)
				}
			}
		}
		if c.HasAvailableLocalFlags() {
			fmt.Fprintf(w, "\nFlags:\n%s", flagUsages(c.LocalFlags()))
		}
		return nil
	})
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		if cmd == root {
			rootHelp(cmd.OutOrStdout())
			return
		}
		defaultHelp(cmd, args)
	})
	for _, c := range commands {
		sub := &cobra.Command{
			Use:                c.name,
			Short:              c.summary,
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := c.run(ctx, e, args); err != nil {
					return runError{err}
				}
				return nil
			},
		}
		sub.SetHelpFunc(func(*cobra.Command, []string) {
			c.run(ctx, e, []string{"--help"}) // prints the command's usage on stdout
		})
		root.AddCommand(sub)
	}
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [COMMAND]",
		Short: "show help for kylix or a command",
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []cobra.Completion
			for _, c := range root.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, cobra.CompletionWithDesc(c.Name(), c.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || target == root && len(args) > 0 || len(stripArgs(rest)) > 0 {
				return fmt.Errorf("no help for %q: not a command", strings.Join(args, " "))
			}
			target.HelpFunc()(target, args)
			return nil
		},
	})
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Short = "print a shell completion script: bash, zsh, fish or powershell"
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) == 0 {
					return errors.New("completion: name a shell: bash, zsh, fish or powershell")
				}
				return fmt.Errorf("completion: unknown shell %q: want bash, zsh, fish or powershell", args[0])
			}
			c.Args = cobra.ArbitraryArgs
		}
	}
	return root
}

// cobraUsageError words one of cobra's usage errors on one line: an unknown
// command with the commands near it (cobra's suggestions, which it puts on
// lines of their own), an unknown flag with the flag near it.
func cobraUsageError(root, cmd *cobra.Command, err error) string {
	msg := strings.TrimRight(err.Error(), "\n")
	if m := unknownCommand.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("unknown command %q", m[1])
		if sug := root.SuggestionsFor(m[1]); len(sug) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(sug, " or "))
		}
		return msg
	}
	return msg + flagSuggestion(cmd.Flags(), err)
}

var unknownCommand = regexp.MustCompile(`^unknown command "(.*)" for "kylix"`)

// stripArgs drops flags from args (for help CMD SUBCMD: the words left).
func stripArgs(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			out = append(out, a)
		}
	}
	return out
}

// addFlagsForCompletion tells cobra each command's flags, for shell
// completion of flag names: each run is called with --help and its output
// discarded, and the flag set it made is kept (newFlags reports it).
func addFlagsForCompletion(ctx context.Context, e *env, root *cobra.Command) {
	for _, sub := range root.Commands() {
		c, ok := commands[sub.Name()]
		if !ok {
			continue
		}
		var got *flags
		ce := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: e.getenv,
			onFlags: func(f *flags) { got = f }}
		c.run(ctx, ce, []string{"--help"})
		if got == nil {
			continue
		}
		got.VisitAll(func(fl *pflag.Flag) {
			if fl.Name != "help" && sub.Flags().Lookup(fl.Name) == nil {
				sub.Flags().AddFlag(fl)
			}
		})
	}
}

// commandName returns the name of the command args run ("" if none), as
// the command line parser finds it: global flags may come before it.
func commandName(args []string) string {
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	cmd, _, err := newRoot(context.Background(), e).Find(args)
	if err != nil || !cmd.HasParent() {
		return ""
	}
	return cmd.Name()
}

// exitCode prints a command's error, worded for the user (errors.go), and
// returns the exit status for it.
func exitCode(ctx context.Context, e *env, err error) int {
	var ee exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return int(ee)
	case errors.Is(err, errHelp):
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintf(e.stderr, "kylix: interrupted\n")
		return exitInterrupted
	}
	fmt.Fprintf(e.stderr, "kylix: %s\n", userMessage(err))
	return exitFailure
}

// rootHelp is kylix --help.
func rootHelp(w io.Writer) {
	fmt.Fprint(w, `kylix moves AI model weights and data from storage into GPU memory.

Usage:
  kylix [--data DIR] COMMAND [FLAGS] [ARGS]
  kylix COMMAND --help          a command's flags and arguments
  kylix --version               the version (also: kylix version)

Commands:
`)
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-11s %s\n", "completion", "print a shell completion script: bash, zsh, fish or powershell")
	fmt.Fprintf(w, "  %-11s %s\n", "help", "show help for kylix or a command (kylix help COMMAND)")
	fmt.Fprintf(w, `
Global flags (before or after the command name):
      --data DIR   the data directory. Default:
                   %s
      --json       print JSON instead of text (the commands that list it)
  -h, --help       show help on stdout and exit 0
  -v, --version    print the version and exit 0

Flags take two dashes (--data DIR or --data=DIR); one-letter flags one (-R).
Flags may come before or after the arguments; "--" ends the flags.

`, strings.ReplaceAll(strings.TrimSpace(defaultDataDirDoc), "\n", "\n                   "))
	fmt.Fprint(w, exitStatusDoc)
	fmt.Fprint(w, `
Shell completion: source <(kylix completion bash), or see kylix completion --help.
`)
}
