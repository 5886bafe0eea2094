package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/units"
	"github.com/kylix/kylix/node"
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

	// node is set when the command runs inside a node (kylix serve),
	// forwarded through its admin socket: open returns its store.
	node *node.Node
	// ctx and args are the command line being run (set by run), for
	// forwarding it to a running node.
	ctx  context.Context
	args []string
	// onFlags, if set, is told of each flag set newFlags makes (shell
	// completion learns the commands' flags this way).
	onFlags func(*flags)
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

// flags is a command's flag set (pflag: GNU-style --long and -x flags,
// anywhere among the arguments), with the flags every store command shares.
// Its methods are pflag's, which take the same arguments as the standard
// flag package's (Var also takes a plain flag.Value).
type flags struct {
	*pflag.FlagSet
	e        *env
	data     string
	jsonOut  bool
	help     bool
	synopsis string
	// creates: the command makes a store where none is (kylix import);
	// the others refuse a data directory that does not exist, so a
	// mistyped --data is an error, not a new empty store.
	creates bool
}

// newFlags makes a command's flag set. usage is the argument synopsis,
// long the help text after it.
func newFlags(e *env, name, synopsis, long string) *flags {
	f := &flags{FlagSet: pflag.NewFlagSet(name, pflag.ContinueOnError), e: e, synopsis: synopsis}
	f.SetOutput(e.stderr)
	f.StringVar(&f.data, "data", e.defaultDataDir(), "data directory (env KYLIX_DATA)")
	f.Usage = func() {
		fmt.Fprintf(f.Output(), "Usage: kylix %s %s\n\n%s\n\nFlags:\n%s\n", name, synopsis, strings.TrimSpace(long), flagUsages(f.FlagSet))
		fmt.Fprintf(f.Output(), "Global flags (--data, --json) may also come before %q. Exit status: 0 ok, 1 failure, 2 usage error (kylix --help).\n", name)
	}
	if e.onFlags != nil {
		e.onFlags(f)
	}
	return f
}

func (f *flags) withJSON() *flags {
	f.BoolVar(&f.jsonOut, "json", false, "print JSON instead of text")
	return f
}

// Var defines a flag with a value of the caller's: a pflag.Value, or a
// standard flag.Value (a one-letter name is then also its -x form).
func (f *flags) Var(v flag.Value, name, usage string) {
	if pv, ok := v.(pflag.Value); ok {
		f.FlagSet.Var(pv, name, usage)
		return
	}
	f.AddGoFlag(&flag.Flag{Name: name, Usage: usage, Value: v, DefValue: v.String()})
}

// prepare finishes the flag set before parsing: a flag defined with a
// one-letter name (f.Bool("r", ...)) is given as -r, and -h/--help is listed.
func (f *flags) prepare() {
	var short []*pflag.Flag
	f.VisitAll(func(fl *pflag.Flag) {
		if len(fl.Name) == 1 && fl.Shorthand == "" {
			short = append(short, fl)
		}
	})
	if len(short) > 0 {
		ns := pflag.NewFlagSet(f.Name(), pflag.ContinueOnError)
		ns.Usage, ns.SortFlags = f.Usage, f.SortFlags
		ns.SetOutput(f.Output())
		f.VisitAll(func(fl *pflag.Flag) {
			if len(fl.Name) != 1 || fl.Shorthand != "" {
				ns.AddFlag(fl)
			}
		})
		for _, fl := range short {
			if ns.ShorthandLookup(fl.Name) == nil {
				fl.Shorthand = fl.Name
			}
			ns.AddFlag(fl)
		}
		f.FlagSet = ns
	}
	if f.Lookup("help") == nil {
		if f.ShorthandLookup("h") == nil {
			f.BoolVarP(&f.help, "help", "h", false, "show this help")
		} else {
			f.BoolVar(&f.help, "help", false, "show this help")
		}
	}
}

// parse parses args, mapping --help to errHelp (printing help on stdout) and
// other mistakes to errUsage (printing the mistake and the usage on stderr).
// Flags may come anywhere among the arguments; "--" ends them. minArgs and
// maxArgs (-1: no limit) bound the positional arguments.
func (f *flags) parse(args []string, minArgs, maxArgs int) error {
	f.prepare()
	f.SetOutput(io.Discard)
	err := f.Parse(args)
	f.SetOutput(f.e.stderr)
	if errors.Is(err, pflag.ErrHelp) || err == nil && f.help {
		f.SetOutput(f.e.stdout)
		f.Usage()
		f.SetOutput(f.e.stderr)
		return errHelp
	}
	if err != nil {
		hint := f.dashHint(args)
		if hint == "" {
			hint = flagSuggestion(f.FlagSet, err)
		}
		fmt.Fprintf(f.e.stderr, "kylix %s: %v%s\n", f.Name(), err, hint)
		f.helpPointer()
		return errUsage
	}
	if n := f.NArg(); n < minArgs || (maxArgs >= 0 && n > maxArgs) {
		want := fmt.Sprintf("%d", minArgs)
		switch {
		case maxArgs < 0:
			want = fmt.Sprintf("at least %d", minArgs)
		case maxArgs != minArgs:
			want = fmt.Sprintf("%d to %d", minArgs, maxArgs)
		}
		fmt.Fprintf(f.e.stderr, "kylix %s: wrong number of arguments: got %d, want %s (kylix %s %s)\n", f.Name(), n, want, f.Name(), f.synopsis)
		f.helpPointer()
		return errUsage
	}
	return nil
}

// helpPointer is the line after a usage error: where the usage is, rather
// than the usage itself (a page of flags would scroll the error away).
func (f *flags) helpPointer() {
	fmt.Fprintf(f.e.stderr, "Run 'kylix %s --help' for its flags and arguments.\n", f.Name())
}

// flagSuggestion returns " (did you mean --NAME?)" for an unknown long
// flag that is near a flag of fs (nearestFlag), or " (did you mean -X?)"
// for a one-letter flag given in the other case (-r for -R); else "".
func flagSuggestion(fs *pflag.FlagSet, err error) string {
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) {
		return ""
	}
	if ne.GetSpecifiedShortnames() != "" {
		c := ne.GetSpecifiedName()
		other := strings.ToUpper(c)
		if other == c {
			other = strings.ToLower(c)
		}
		if fl := fs.ShorthandLookup(other); other != c && fl != nil && !fl.Hidden {
			return fmt.Sprintf(" (did you mean -%s?)", other)
		}
		return ""
	}
	if name := nearestFlag(fs, ne.GetSpecifiedName(), nil); name != "" {
		return fmt.Sprintf(" (did you mean --%s?)", name)
	}
	return ""
}

// nearestFlag returns the name of the visible flag of fs nearest to name:
// at most two edits away (editDistance; one for names of up to three
// letters), or, failing that, the one flag name begins with; "" if none.
// skip, if set, leaves flags out.
func nearestFlag(fs *pflag.FlagSet, name string, skip func(*pflag.Flag) bool) string {
	name = strings.ToLower(name)
	limit := 2
	if len(name) <= 3 {
		limit = 1
	}
	best, bestD := "", limit+1
	var prefixed []string
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Hidden || skip != nil && skip(fl) {
			return
		}
		if d := editDistance(name, fl.Name); d < bestD || d == bestD && fl.Name < best {
			best, bestD = fl.Name, d
		}
		if len(name) >= 2 && strings.HasPrefix(fl.Name, name) {
			prefixed = append(prefixed, fl.Name)
		}
	})
	if best == "" && len(prefixed) == 1 {
		best = prefixed[0]
	}
	return best
}

// flagUsages lists the flags of fs as pflag does, without pflag's
// "[=true|false]" after every boolean flag.
func flagUsages(fs *pflag.FlagSet) string {
	var left, right []string
	width := 0
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Hidden {
			return
		}
		l := "      --" + fl.Name
		if fl.Shorthand != "" && fl.ShorthandDeprecated == "" {
			l = "  -" + fl.Shorthand + ", --" + fl.Name
		}
		varname, usage := pflag.UnquoteUsage(fl)
		isBool := fl.Value.Type() == "bool" || fl.Value.Type() == "boolfunc"
		if varname != "" && !isBool {
			l += " " + varname
		}
		if fl.NoOptDefVal != "" && !isBool {
			l += "[=" + fl.NoOptDefVal + "]"
		}
		switch fl.DefValue {
		case "", "0", "false", "[]", "0s", "<nil>":
		default:
			if fl.Value.Type() == "string" {
				usage += fmt.Sprintf(" (default %q)", fl.DefValue)
			} else {
				usage += fmt.Sprintf(" (default %s)", fl.DefValue)
			}
		}
		width = max(width, len(l))
		left, right = append(left, l), append(right, usage)
	})
	var b strings.Builder
	for i := range left {
		fmt.Fprintf(&b, "%-*s   %s\n", width, left[i], strings.ReplaceAll(right[i], "\n", "\n"+strings.Repeat(" ", width+3)))
	}
	return b.String()
}

// dashHint explains a long flag given with one dash (-data, as the
// standard flag package allowed): pflag reads it as -d -a -t -a.
func (f *flags) dashHint(args []string) string {
	for _, a := range args {
		if a == "--" {
			break
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if f.Lookup(name) != nil {
				return fmt.Sprintf(" (long flags take two dashes: --%s)", a[1:])
			}
		}
	}
	return ""
}

// open opens the store in --data. Inside a node it returns the node's open
// store (Close then only drops a reference), with the files closed in the
// mount committed. When a node serves --data, the whole command line is
// forwarded to it instead (nodeclient.go): open then returns an exitError
// with the node's exit status, which the command returns as is.
func (f *flags) open() (*chunkstore.Store, error) {
	if n := f.e.node; n != nil {
		if err := n.Sync(); err != nil {
			fmt.Fprintf(f.e.stderr, "kylix: mount: %v\n", err)
		}
		s := n.Store()
		s.Retain()
		return s, nil
	}
	if code, ok := forwardToNode(f.e, f.data); ok {
		return nil, exitError(code)
	}
	s, err := f.openLocal()
	// The node listens on its admin socket before it locks the store, so
	// a node that locked it between the two tries answers now.
	if errors.Is(err, chunkstore.ErrLocked) {
		if code, ok := forwardToNode(f.e, f.data); ok {
			return nil, exitError(code)
		}
	}
	return s, err
}

// checkDataDir refuses a data directory that does not exist, unless the
// command creates the store (kylix import): a mistyped --data is an error,
// not a new empty store.
func (f *flags) checkDataDir() error {
	if !f.creates {
		if _, err := os.Stat(f.data); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no store at %s: the directory does not exist (kylix import creates one there; choose another with --data DIR or KYLIX_DATA)", f.data)
		}
	}
	return nil
}

func (f *flags) openLocal() (*chunkstore.Store, error) {
	if err := f.checkDataDir(); err != nil {
		return nil, err
	}
	s, err := chunkstore.Open(chunkstore.Options{
		Dir:    f.data,
		Logger: slog.New(slog.NewTextHandler(f.e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if errors.Is(err, fs.ErrPermission) {
		err = fmt.Errorf("%w (run as the data directory's owner, or choose another with --data DIR or KYLIX_DATA)", err)
	}
	return s, err
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
	now   func() time.Time // time.Now; tests set it
}

func newProgress(e *env, label string) *progress {
	return &progress{e: e, label: label, start: time.Now(), now: time.Now}
}

// rateKnown says whether done bytes after el are enough to tell a rate (and
// so an ETA) worth showing: a second, or 5% of the bytes. Before that the
// rate is mostly the time spent starting (a half-second import once showed
// an ETA of 21 minutes).
func rateKnown(done, total int64, el time.Duration) bool {
	return done > 0 && (el >= time.Second || total > 0 && done*20 >= total)
}

func (p *progress) update(done, total int64) {
	if !p.e.tty {
		return
	}
	now := p.now()
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
	el := now.Sub(p.start)
	speed := ""
	if rateKnown(done, total, el) && el > 0 {
		rate := float64(done) / el.Seconds()
		speed = " " + human(int64(rate)) + "/s"
		if total > done {
			speed += fmt.Sprintf(" ETA %s", time.Duration(float64(total-done)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	fmt.Fprintf(p.e.stderr, "\r%s [%s] %3.0f%% %s/%s%s\033[K", p.label, bar, frac*100, human(done), human(total), speed)
}

func (p *progress) finish() {
	if p.shown {
		fmt.Fprint(p.e.stderr, "\r\033[K")
	}
}

// human formats a byte count with binary units.
func human(n int64) string { return units.Human(n) }
