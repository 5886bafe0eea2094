// Command kylix is the Kylix node and its command-line tool: import models and
// datasets into the content-addressed store, export them, inspect, verify and
// collect garbage, and (kylix serve) mount the namespace for unmodified
// programs.
//
// This package is wiring only: flags, output and exit codes. The work is done
// by chunkstore and the packages beside it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand. run returns an error to print; an exitError sets
// the exit status without printing more.
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, newEnv(os.Stdin, os.Stdout, os.Stderr), os.Args[1:]))
}

// run executes one command line and returns the exit status.
func run(ctx context.Context, e *env, args []string) int {
	e.ctx, e.args = ctx, args // for forwarding to a running node (admin.go)
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return exitCode(e, c.run(ctx, e, []string{"--help"}))
			}
		}
		usage(e.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "kylix: unknown command %q\n\n", args[0])
		usage(e.stderr)
		return 2
	}
	return exitCode(e, c.run(ctx, e, args[1:]))
}

func exitCode(e *env, err error) int {
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return int(ee)
	case errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(e.stderr, "kylix: %v\n", err)
	return 1
}

func usage(w io.Writer) {
	fmt.Fprint(w, `kylix moves AI model weights and data from storage into GPU memory.

Usage: kylix COMMAND [FLAGS] [ARGS]

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
	fmt.Fprintf(w, `
Every command takes --data DIR, the data directory. Default: %s
(the KYLIX_DATA environment variable overrides the default; --data overrides both).
Run 'kylix COMMAND --help' for a command's flags.
`, strings.TrimSpace(defaultDataDirDoc))
}
