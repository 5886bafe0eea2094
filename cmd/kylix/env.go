package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/kylix/kylix/chunkstore"
)

var (
	errHelp  = errors.New("help shown")
	errUsage = errors.New("usage error")
)

// env is what a command runs with: its streams and whether stderr is a
// terminal (for progress bars).
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	tty            bool
	getenv         func(string) string

	// store is set when the command runs inside a node (kylix serve),
	// forwarded through its admin socket: open returns it.
	store *chunkstore.Store
	// ctx and args are the command line being run (set by run), for
	// forwarding it to a running node.
	ctx  context.Context
	args []string
}

func newEnv(stdin io.Reader, stdout, stderr *os.File) *env {
	return &env{
		stdin:  stdin,
		stdout: stdout,
		stderr: stderr,
		tty:    term.IsTerminal(int(stderr.Fd())),
		getenv: os.Getenv,
	}
}

const defaultDataDirDoc = `
$KYLIX_DATA if set; else /var/lib/kylix when run as root; else
$XDG_DATA_HOME/kylix (~/.local/share/kylix)`

// defaultDataDir resolves the documented default.
func (e *env) defaultDataDir() string {
	if d := e.getenv("KYLIX_DATA"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/kylix"
	}
	if d := e.getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "kylix")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "kylix-data"
	}
	return filepath.Join(home, ".local", "share", "kylix")
}

// flags is a FlagSet with the flags every store command shares.
type flags struct {
	*flag.FlagSet
	e       *env
	data    string
	jsonOut bool
}

// newFlags makes a command's flag set. usage is the argument synopsis,
// long the help text after it.
func newFlags(e *env, name, synopsis, long string) *flags {
	f := &flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), e: e}
	f.SetOutput(e.stderr)
	f.StringVar(&f.data, "data", e.defaultDataDir(), "data directory (env KYLIX_DATA)")
	f.Usage = func() {
		fmt.Fprintf(f.Output(), "Usage: kylix %s %s\n\n%s\n\nFlags:\n", name, synopsis, strings.TrimSpace(long))
		f.PrintDefaults()
	}
	return f
}

func (f *flags) withJSON() *flags {
	f.BoolVar(&f.jsonOut, "json", false, "print JSON instead of text")
	return f
}

// parse parses args, mapping -h to errHelp (printing help on stdout) and
// other mistakes to errUsage. nargs bounds the positional arguments.
func (f *flags) parse(args []string, minArgs, maxArgs int) error {
	f.SetOutput(io.Discard)
	err := f.Parse(args)
	f.SetOutput(f.e.stderr)
	if errors.Is(err, flag.ErrHelp) {
		f.SetOutput(f.e.stdout)
		f.Usage()
		return errHelp
	}
	if err != nil {
		fmt.Fprintf(f.e.stderr, "kylix %s: %v\n", f.Name(), err)
		f.Usage()
		return errUsage
	}
	if n := f.NArg(); n < minArgs || (maxArgs >= 0 && n > maxArgs) {
		fmt.Fprintf(f.e.stderr, "kylix %s: wrong number of arguments (%d)\n", f.Name(), n)
		f.Usage()
		return errUsage
	}
	return nil
}

// open opens the store in --data. Inside a node it returns the node's open
// store (Close then only drops a reference). When a node serves --data, the
// whole command line is forwarded to it instead (admin.go): open then
// returns an exitError with the node's exit status, which the command
// returns as is.
func (f *flags) open() (*chunkstore.Store, error) {
	if f.e.store != nil {
		f.e.store.Retain()
		return f.e.store, nil
	}
	if code, ok := forwardToNode(f.e, f.data); ok {
		return nil, exitError(code)
	}
	s, err := f.openLocal()
	// A node that is starting holds the lock before its socket answers.
	for wait := 0; errors.Is(err, chunkstore.ErrLocked) && wait < 50 && lockedByNode(f.data); wait++ {
		time.Sleep(100 * time.Millisecond)
		if code, ok := forwardToNode(f.e, f.data); ok {
			return nil, exitError(code)
		}
	}
	return s, err
}

func (f *flags) openLocal() (*chunkstore.Store, error) {
	return chunkstore.Open(chunkstore.Options{
		Dir:    f.data,
		Logger: slog.New(slog.NewTextHandler(f.e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
}

func (f *flags) printJSON(v any) error {
	enc := json.NewEncoder(f.e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// progress draws a progress bar on stderr when it is a terminal.
type progress struct {
	e     *env
	label string
	start time.Time
	last  time.Time
	shown bool
}

func newProgress(e *env, label string) *progress {
	return &progress{e: e, label: label, start: time.Now()}
}

func (p *progress) update(done, total int64) {
	if !p.e.tty {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = now
	p.shown = true
	frac := 1.0
	if total > 0 {
		frac = min(1, float64(done)/float64(total))
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("=", n) + strings.Repeat(" ", width-n)
	el := now.Sub(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(done) / el
	}
	eta := ""
	if rate > 0 && total > done {
		eta = fmt.Sprintf(" ETA %s", time.Duration(float64(total-done)/rate*float64(time.Second)).Round(time.Second))
	}
	fmt.Fprintf(p.e.stderr, "\r%s [%s] %3.0f%% %s/%s %s/s%s   ", p.label, bar, frac*100, human(done), human(total), human(int64(rate)), eta)
}

func (p *progress) finish() {
	if p.shown {
		fmt.Fprint(p.e.stderr, "\r\033[K")
	}
}

// human formats a byte count with binary units.
func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
