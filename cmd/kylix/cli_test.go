package main

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runIn runs one command line in this process, as main does, against the
// data directory data (KYLIX_DATA), and returns its output and exit status.
func runIn(t *testing.T, data string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "KYLIX_DATA" {
			return data
		}
		return ""
	}}
	code := run(context.Background(), e, args)
	return result{out.String(), errb.String(), code}
}

// cliStore is a data directory holding models/m/{a.txt,sub/b.txt} and
// c.txt.
func cliStore(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(src, "m", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "m", "a.txt"), []byte("alpha"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "m", "sub", "b.txt"), []byte("beta"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "c.txt"), []byte("gamma"), 0o644))
	data := t.TempDir()
	for _, c := range [][]string{{"import", filepath.Join(src, "m"), "models/m"}, {"import", filepath.Join(src, "c.txt"), "c.txt"}} {
		r := runIn(t, data, c...)
		require.Equal(t, 0, r.code, "%v: %s", c, r.stderr)
	}
	return data
}

func lsNames(t *testing.T, out string) []string {
	t.Helper()
	var ents []lsEntry
	require.NoError(t, json.Unmarshal([]byte(out), &ents), out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	return names
}

// Flags may come before or after the arguments, and the global ones
// (--data, --json) before the command name too.
func TestFlagsAnywhere(t *testing.T) {
	data := cliStore(t)
	elsewhere := t.TempDir() // KYLIX_DATA points here: only --data finds the store
	want := []string{"a.txt", "sub"}
	for _, args := range [][]string{
		{"ls", "--data", data, "--json", "models/m"},
		{"ls", "models/m", "--json", "--data", data},
		{"ls", "models/m", "--json", "--data=" + data},
		{"--data", data, "ls", "models/m", "--json"},
		{"--data=" + data, "--json", "ls", "models/m"},
		{"--json", "ls", "--data", data, "models/m"},
	} {
		r := runIn(t, elsewhere, args...)
		if assert.Equal(t, 0, r.code, "%v: %s", args, r.stderr) {
			assert.Equal(t, want, lsNames(t, r.stdout), "%v", args)
		}
	}
	// One-letter flags, alone or with their long name, anywhere.
	for _, args := range [][]string{{"ls", "-R", "--json", "models"}, {"ls", "models", "--json", "--recursive"}, {"--json", "ls", "models", "-R"}} {
		r := runIn(t, data, args...)
		if assert.Equal(t, 0, r.code, "%v: %s", args, r.stderr) {
			assert.Equal(t, []string{"models/m", "models/m/a.txt", "models/m/sub", "models/m/sub/b.txt"}, lsNames(t, r.stdout), "%v", args)
		}
	}
	// "--" ends the flags: what follows is an argument even if it looks like one.
	r := runIn(t, data, "ls", "--json", "--", "--json")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "kylix: --json: no such file or directory in the store")
	// Every command that had --json keeps it.
	for _, name := range []string{"df", "doctor", "du", "fsck", "gc", "import", "load", "ls", "node", "pin", "stat", "top", "verify", "version", "warm"} {
		r := runIn(t, data, name, "--help")
		assert.Regexp(t, `(?m)^ +--json +print JSON`, r.stdout, "kylix %s --help", name)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-v"}, {"version"}} {
		r := runIn(t, t.TempDir(), args...)
		assert.Equal(t, 0, r.code, "%v", args)
		assert.Regexp(t, `^kylix \S+ \(.*go1\.\d+.*, linux/\w+\)\n$`, r.stdout, "%v", args)
		assert.Empty(t, r.stderr, "%v", args)
	}
	old := version
	version = "v1.2.3-test"
	t.Cleanup(func() { version = old })
	r := runIn(t, t.TempDir(), "version", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	assert.Equal(t, "v1.2.3-test", v.Version)
	assert.NotEmpty(t, v.Go)
	assert.True(t, strings.HasPrefix(runIn(t, t.TempDir(), "--version").stdout, "kylix v1.2.3-test "))
}

// Help goes to stdout with status 0 when asked for; a usage error prints the
// mistake and the usage on stderr with status 2.
func TestHelpStreamsAndExitCodes(t *testing.T) {
	data := cliStore(t)
	asked := []struct {
		args []string
		want string
	}{
		{nil, "Exit status:"},
		{[]string{"-h"}, "Commands:"},
		{[]string{"--help"}, "Global flags"},
		{[]string{"help"}, "Exit status:"},
		{[]string{"help", "ls"}, "Usage: kylix ls"},
		{[]string{"ls", "--help"}, "Usage: kylix ls"},
		{[]string{"ls", "-h"}, "-R, --recursive"},
		{[]string{"--data", data, "ls", "models", "--help"}, "Usage: kylix ls"},
		{[]string{"--help", "ls"}, "Usage: kylix ls"},
		{[]string{"-h", "import"}, "Usage: kylix import"},
		{[]string{"import", "--help"}, "--no-dereference"},
		{[]string{"help", "completion"}, "completion"},
		{[]string{"completion", "--help"}, "bash"},
	}
	for _, c := range asked {
		r := runIn(t, data, c.args...)
		assert.Equal(t, 0, r.code, "kylix %v", c.args)
		assert.Contains(t, r.stdout, c.want, "kylix %v", c.args)
		assert.Empty(t, r.stderr, "kylix %v", c.args)
	}
	for name := range commands {
		r := runIn(t, data, "help", name)
		assert.Equal(t, 0, r.code, "help %s", name)
		assert.Contains(t, r.stdout, "Usage: kylix "+name, "help %s", name)
	}
	usage := []struct {
		args []string
		want []string
	}{
		{[]string{"frobnicate"}, []string{`kylix: unknown command "frobnicate"` + "\n", "Run 'kylix --help' for the commands"}},
		{[]string{"lss"}, []string{`kylix: unknown command "lss" (did you mean ls?)`}},
		{[]string{"ls", "--nope"}, []string{"kylix ls: unknown flag: --nope\n", "Run 'kylix ls --help' for its flags and arguments."}},
		{[]string{"ls", "--jsn"}, []string{"kylix ls: unknown flag: --jsn (did you mean --json?)"}},
		{[]string{"ls", "--rec"}, []string{"kylix ls: unknown flag: --rec (did you mean --recursive?)"}},
		{[]string{"ls", "-r"}, []string{"kylix ls: unknown shorthand flag: 'r' in -r (did you mean -R?)"}},
		{[]string{"stat", "--chunk=1", "x"}, []string{"kylix stat: unknown flag: --chunk (did you mean --chunks?)"}},
		{[]string{"--nope", "ls"}, []string{"unknown flag: --nope"}},
		{[]string{"--jsn", "ls"}, []string{"kylix: unknown flag: --jsn (did you mean --json?)"}},
		{[]string{"ls", "-data", data}, []string{"unknown shorthand flag: 'd' in -data (long flags take two dashes: --data)"}},
		{[]string{"ls", "a", "b"}, []string{"kylix ls: wrong number of arguments: got 2, want 0 to 1 (kylix ls [--data DIR]", "Run 'kylix ls --help'"}},
		{[]string{"import", "x"}, []string{"kylix import: wrong number of arguments: got 1, want 2"}},
		{[]string{"load"}, []string{"want at least 1"}},
		{[]string{"df", "--data"}, []string{"flag needs an argument: --data"}},
		{[]string{"help", "nope"}, []string{`no help for "nope"`}},
		{[]string{"completion"}, []string{"name a shell"}},
		{[]string{"completion", "tcsh"}, []string{`unknown shell "tcsh"`}},
		{[]string{"version", "extra"}, []string{"wrong number of arguments"}},
	}
	for _, c := range usage {
		r := runIn(t, data, c.args...)
		assert.Equal(t, 2, r.code, "kylix %v", c.args)
		assert.Empty(t, r.stdout, "kylix %v", c.args)
		// The mistake and where the usage is, not a page of usage that
		// scrolls the mistake away.
		assert.LessOrEqual(t, strings.Count(r.stderr, "\n"), 2, "kylix %v: %s", c.args, r.stderr)
		assert.NotContains(t, r.stderr, "Usage:", "kylix %v", c.args)
		for _, w := range c.want {
			assert.Contains(t, r.stderr, w, "kylix %v", c.args)
		}
	}
}

func TestCompletion(t *testing.T) {
	data := t.TempDir()
	for shell, want := range map[string]string{
		"bash":       "__start_kylix",
		"zsh":        "#compdef kylix",
		"fish":       "complete -c kylix",
		"powershell": "Register-ArgumentCompleter",
	} {
		r := runIn(t, data, "completion", shell)
		assert.Equal(t, 0, r.code, shell)
		assert.Contains(t, r.stdout, want, shell)
		assert.Empty(t, r.stderr, shell)
	}
	// What the scripts ask kylix for: command names, and each command's
	// flags (learnt from its flag set).
	r := runIn(t, data, "__complete", "")
	require.Equal(t, 0, r.code, r.stderr)
	for _, c := range []string{"import", "ls", "serve", "version", "completion", "help"} {
		assert.Regexp(t, "(?m)^"+c+"\t", r.stdout)
	}
	r = runIn(t, data, "__complete", "ls", "--")
	require.Equal(t, 0, r.code, r.stderr)
	for _, fl := range []string{"--data", "--json", "--recursive"} {
		assert.Regexp(t, "(?m)^"+fl+"\t", r.stdout)
	}
	r = runIn(t, data, "__complete", "--data", data, "import", "--hf")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, "(?m)^--hf-cache\t", r.stdout)
	assert.Regexp(t, "(?m)^--hf-cache-dir\t", r.stdout)
	r = runIn(t, data, "__complete", "help", "im")
	assert.Regexp(t, "(?m)^import\t", r.stdout)
}

// Errors say which path and what to do, in the store's terms, not which
// package failed.
func TestErrorWording(t *testing.T) {
	data := cliStore(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"ls", "models/x"}, "kylix: models/x: no such file or directory in the store (kylix ls models to list)\n"},
		{[]string{"stat", "nothing"}, "kylix: nothing: no such file or directory in the store (kylix ls to list)\n"},
		{[]string{"export", "models/m/zzz", t.TempDir()}, "kylix: models/m/zzz: no such file or directory in the store (kylix ls models/m to list)\n"},
		{[]string{"rm", "models/gone"}, "kylix: models/gone: no such file or directory in the store (kylix ls models to list)\n"},
		{[]string{"rm", "models/m"}, "kylix: models/m: directory not empty (kylix rm -r models/m removes it and everything under it)\n"},
		{[]string{"ls", "c.txt/inside"}, "kylix: c.txt: not a directory in the store (kylix stat c.txt shows what it is)\n"},
	}
	for _, c := range cases {
		r := runIn(t, data, c.args...)
		assert.Equal(t, 1, r.code, "kylix %v", c.args)
		assert.Equal(t, c.want, r.stderr, "kylix %v", c.args)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	r := runIn(t, data, "import", missing, "models/y")
	assert.Equal(t, "kylix: import source "+missing+": no such file or directory\n", r.stderr)
	out := filepath.Join(t.TempDir(), "c.txt")
	require.Equal(t, 0, runIn(t, data, "export", "c.txt", out).code)
	r = runIn(t, data, "export", "c.txt", out)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "file already exists (kylix export --force replaces existing files)\n")
}

// No error message the code makes starts with the name of a package (or of
// a library inside one): the CLI prints them as they are, so they must read
// as what went wrong, not where.
func TestErrorsNameNoPackage(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	// Package names of the module, and the component names once used as
	// prefixes.
	names := map[string]bool{"cufile": true, "hostdev": true, "giouring": true, "nvrtc": true, "demomodel": true}
	fset := token.NewFileSet()
	var files []*ast.File
	var paths []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		names[f.Name.Name] = true
		files, paths = append(files, f), append(paths, p)
		return nil
	})
	require.NoError(t, err)
	delete(names, "main")
	delete(names, "safetensors") // the file format's name, which users know
	prefix := regexp.MustCompile(`^([a-z0-9]+): `)
	for i, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || !(pkg.Name == "fmt" && sel.Sel.Name == "Errorf" || pkg.Name == "errors" && sel.Sel.Name == "New") {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if m := prefix.FindStringSubmatch(s); m != nil && names[m[1]] {
				rel, _ := filepath.Rel(root, paths[i])
				t.Errorf("%s:%d: error %q starts with the package name %q: say what went wrong for the user instead",
					rel, fset.Position(lit.Pos()).Line, s, m[1])
			}
			return true
		})
	}
}

// commandName finds the command as the parser does, global flags first or
// not (the admin socket refuses a forwarded serve with it, and a starting
// node is recognised by it in /proc/PID/cmdline).
func TestCommandName(t *testing.T) {
	for want, args := range map[string][]string{
		"serve": {"--data", "/d", "serve", "--mount", "/m"},
		"ls":    {"--json", "--data=/d", "ls", "serve"},
		"load":  {"load", "--device", "host", "m"},
		"":      {"--data", "/d"},
	} {
		assert.Equal(t, want, commandName(args), "%v", args)
	}
	assert.Equal(t, "", commandName(nil))
	assert.Equal(t, "", commandName([]string{"frobnicate"}))
}

// A command stopped by Ctrl-C or SIGTERM (its context cancelled) exits 130.
func TestInterruptedExit130(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	data := filepath.Join(t.TempDir(), "data")
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "KYLIX_DATA" {
			return data
		}
		return ""
	}}
	assert.Equal(t, 130, run(ctx, e, []string{"import", src, "m"}))
	assert.Equal(t, "kylix: interrupted\n", errb.String())
}

// stdValue is a flag.Value of the standard library's kind (no Type method).
type stdValue struct{ s string }

func (v *stdValue) String() string     { return v.s }
func (v *stdValue) Set(s string) error { v.s = s; return nil }

// The flag API commands are written against (newFlags, the flag package's
// method signatures, parse) works as before, with flags anywhere.
func TestFlagsAPI(t *testing.T) {
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(string) string { return "/default" }}
	f := newFlags(e, "x", "[FLAGS] A B", "Does x.").withJSON()
	var (
		s   string
		b   bool
		i   int
		i64 int64
		d   time.Duration
		u   uint64
		fl  float64
		fn  []string
		sv  stdValue
	)
	f.StringVar(&s, "name", "", "")
	f.BoolVar(&b, "yes", false, "")
	f.IntVar(&i, "n", 0, "")
	f.Int64Var(&i64, "big", 0, "")
	f.DurationVar(&d, "wait", 0, "")
	f.Uint64Var(&u, "count", 0, "")
	f.Float64Var(&fl, "ratio", 0, "")
	f.Func("each", "", func(v string) error { fn = append(fn, v); return nil })
	f.Var(&sv, "std", "")
	r := f.Bool("r", false, "one-letter name: given as -r")
	err := f.parse([]string{"A", "--name", "v", "--yes", "-n", "3", "--big=5", "--wait", "2s", "B", "--count", "7",
		"--ratio", "0.5", "--each", "p", "--each", "q", "--std", "w", "-r", "--json", "--data", "/d"}, 2, 2)
	require.NoError(t, err, errb.String())
	assert.Equal(t, []string{"A", "B"}, f.Args())
	assert.Equal(t, 2, f.NArg())
	assert.Equal(t, "B", f.Arg(1))
	assert.Equal(t, "/d", f.data)
	assert.True(t, f.jsonOut)
	assert.Equal(t, "v", s)
	assert.True(t, b)
	assert.Equal(t, 3, i)
	assert.Equal(t, int64(5), i64)
	assert.Equal(t, 2*time.Second, d)
	assert.Equal(t, uint64(7), u)
	assert.Equal(t, 0.5, fl)
	assert.Equal(t, []string{"p", "q"}, fn)
	assert.Equal(t, "w", sv.s)
	assert.True(t, *r)

	g := newFlags(e, "x", "", "")
	assert.Equal(t, errHelp, g.parse([]string{"-h"}, 0, 0))
	assert.Contains(t, out.String(), "Usage: kylix x")
	assert.Contains(t, out.String(), "--data string")
	h := newFlags(e, "x", "", "")
	assert.Equal(t, errUsage, h.parse([]string{"one"}, 0, 0))
}
