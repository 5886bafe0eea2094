package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lsJSON returns the names kylix ls --json printed.
func lsJSON(t *testing.T, out string) []string {
	t.Helper()
	var ents []struct {
		Name string `json:"name"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ents), out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	return names
}

// TestCLIConventions runs the real binary: help and usage streams, exit
// statuses, --version (also as set with -ldflags), flags anywhere, shell
// completion, and an error worded for the user.
func TestCLIConventions(t *testing.T) {
	work := t.TempDir()
	data := filepath.Join(t.TempDir(), "data")
	out, errs, code := kylix(t, work)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "Exit status:")
	assert.Contains(t, out, "2    usage error")
	assert.Empty(t, errs)

	out, errs, code = kylix(t, work, "frobnicate", "--data", data)
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.Equal(t, "kylix: unknown command \"frobnicate\"\nRun 'kylix --help' for the commands and global flags.\n", errs)

	out, errs, code = kylix(t, work, "ls", "--data", data, "-data", data)
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.Contains(t, errs, "long flags take two dashes: --data")

	// A mistyped flag: the mistake, the flag meant, where the usage is;
	// not 83 lines of usage scrolling the mistake away (issue 23, C.4).
	out, errs, code = kylix(t, work, "serve", "--moutn", "/x", "--data", data)
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.Equal(t, "kylix serve: unknown flag: --moutn (did you mean --mount?)\nRun 'kylix serve --help' for its flags and arguments.\n", errs)
	_, errs, code = kylix(t, work, "--jsn", "ls", "--data", data)
	assert.Equal(t, 2, code)
	assert.Equal(t, "kylix: unknown flag: --jsn (did you mean --json?)\nRun 'kylix --help' for the commands and global flags.\n", errs)
	_, errs, code = kylix(t, work, "lss")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, `kylix: unknown command "lss" (did you mean ls?)`)

	out, _, code = kylix(t, work, "--version")
	assert.Equal(t, 0, code)
	assert.Regexp(t, `^kylix \S+ \(`, out)

	// The version set at build time.
	bin := filepath.Join(t.TempDir(), "kylix")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-clitest", "-o", bin, "github.com/kylix/kylix/cmd/kylix")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := build.CombinedOutput()
	require.NoError(t, err, "%s", b)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		b, err = exec.Command(bin, args...).Output()
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(string(b), "kylix v9.8.7-clitest ("), "%v: %s", args, b)
	}

	// Flags anywhere, global ones before the command name.
	src := filepath.Join(work, "src")
	require.NoError(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha"), 0o644))
	mustKylix(t, work, "--data", data, "import", "src", "models/m")
	for _, args := range [][]string{
		{"ls", "models/m", "--json", "--data", data},
		{"--data", data, "--json", "ls", "models/m"},
		{"ls", "--data=" + data, "models/m", "--json"},
	} {
		assert.Equal(t, []string{"a.txt", "sub"}, lsJSON(t, mustKylix(t, work, args...)), "%v", args)
	}
	_, errs, code = kylix(t, work, "stat", "models/nope", "--data", data)
	assert.Equal(t, 1, code)
	assert.Equal(t, "kylix: models/nope: no such file or directory in the store (kylix ls models to list)\n", errs)

	out = mustKylix(t, work, "completion", "bash")
	assert.Contains(t, out, "__start_kylix")
}

// TestCLIThroughNode: a command line forwarded to a running node parses
// there as it does locally (flags after the arguments, global flags before
// the command name), and its errors come back worded the same.
func TestCLIThroughNode(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "a.txt"), []byte("alpha"), 0o644))
	startNode(t, data, mnt)
	mustKylix(t, work, "--data", data, "import", "a.txt", "models/m/a.txt")
	for _, args := range [][]string{
		{"ls", "models/m", "--json", "--data", data},
		{"--data", data, "--json", "ls", "models/m"},
	} {
		assert.Equal(t, []string{"a.txt"}, lsJSON(t, mustKylix(t, work, args...)), "%v", args)
	}
	b, err := os.ReadFile(filepath.Join(mnt, "models", "m", "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "alpha", string(b))
	_, errs, code := kylix(t, work, "rm", "models", "--data", data)
	assert.Equal(t, 1, code)
	assert.Equal(t, "kylix: models: directory not empty (kylix rm -r models removes it and everything under it)\n", errs)
	mustKylix(t, work, "--data", data, "rm", "models", "-r")
	if _, err := os.Stat(filepath.Join(mnt, "models")); !os.IsNotExist(err) {
		t.Errorf("models after rm -r through the node: %v", err)
	}
}

// TestStatAndLsSayOneTrueThing: kylix stat names the pack that holds
// exactly a file on one line, also for a file whose repeated chunks are
// stored in place (it said "whole-file pack: none (served by the daemon,
// not passthrough)" and then named that pack as the passthrough pack);
// kylix ls labels its columns, the share in memory among them (issue 23,
// C.6).
func TestStatAndLsSayOneTrueThing(t *testing.T) {
	work := t.TempDir()
	data := filepath.Join(work, "data")
	// Ten 4 MiB tensors (a chunk each), the first also the first of a file
	// imported before: B's pack holds all of B (the duplicate stored in
	// place), while the index names A's copy of that chunk.
	const size = 4 << 20
	a, b := safetensorsFile(10, size, 7), safetensorsFile(10, size, 8)
	data0 := len(a) - 10*size
	copy(b[data0:data0+size], a[data0:data0+size])
	require.NoError(t, os.WriteFile(filepath.Join(work, "a.bin"), a, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "dup.bin"), b, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "small.txt"), []byte("small"), 0o644))
	mustKylix(t, work, "--data", data, "import", "a.bin", "a.bin")
	mustKylix(t, work, "--data", data, "import", "dup.bin", "m/dup.bin")
	mustKylix(t, work, "--data", data, "import", "small.txt", "m/small.txt")

	var js struct {
		WholeFilePack   string `json:"whole_file_pack"`
		PassthroughPack string `json:"passthrough_pack"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, work, "--data", data, "stat", "--json", "m/dup.bin")), &js))
	require.NotEmpty(t, js.PassthroughPack, "the file with its repeats in place has a pack holding exactly it")
	require.Empty(t, js.WholeFilePack, "the index points its repeats at their first copy")
	out := mustKylix(t, work, "--data", data, "stat", "m/dup.bin")
	assert.Equal(t, 1, strings.Count(out, "pack:"), out)
	assert.Contains(t, out, "\nwhole-file pack: "+js.PassthroughPack+" (exactly the file, its repeated chunks stored in place;")
	assert.NotContains(t, out, "none")

	out = mustKylix(t, work, "--data", data, "stat", "m/small.txt")
	assert.Equal(t, 1, strings.Count(out, "pack:"), out)
	assert.Contains(t, out, "\nwhole-file pack: none: the node serves every read (no passthrough)\nreads checked by: the node:")

	lines := strings.Split(mustKylix(t, work, "--data", data, "ls", "m"), "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	assert.Regexp(t, `^ *MODE +UID +GID +SIZE +MODIFIED +IN MEMORY NAME$`, lines[0])
	assert.Regexp(t, `^ -rw-r--r-- +\d+ +\d+ +40\.0 MiB +\S+ \S+ +\d+% dup\.bin$`, lines[1])
}
