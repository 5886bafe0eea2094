package test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tourCommands returns the command lines of the README's tour block (its
// first sh block after "## A short tour"): comments and blank lines
// dropped, a comment after a command (two spaces, then #) cut off.
func tourCommands(t *testing.T, readme string) []string {
	t.Helper()
	_, after, ok := strings.Cut(readme, "\n## A short tour\n")
	require.True(t, ok, "README.md has no \"## A short tour\" section")
	_, block, ok := strings.Cut(after, "```sh\n")
	require.True(t, ok, "the tour section has no ```sh block")
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok, "the tour's sh block does not end")
	var cmds []string
	for _, l := range strings.Split(block, "\n") {
		if i := strings.Index(l, "  #"); i >= 0 {
			l = l[:i]
		}
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			cmds = append(cmds, l)
		}
	}
	return cmds
}

// tourScriptCommands returns scripts/tour.sh's lines between BEGIN TOUR and
// END TOUR as the README would show them: the script's own lines (tour_...)
// dropped, and the "tour_if NEED " that guards a README line taken off.
func tourScriptCommands(t *testing.T, script string) []string {
	t.Helper()
	_, body, ok := strings.Cut(script, "\n# BEGIN TOUR\n")
	require.True(t, ok, "scripts/tour.sh has no BEGIN TOUR line")
	body, _, ok = strings.Cut(body, "\n# END TOUR\n")
	require.True(t, ok, "scripts/tour.sh has no END TOUR line")
	guard := regexp.MustCompile(`^tour_if \S+ `)
	var cmds []string
	for _, l := range strings.Split(body, "\n") {
		l = guard.ReplaceAllString(strings.TrimSpace(l), "")
		if l != "" && !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "tour_") {
			cmds = append(cmds, l)
		}
	}
	return cmds
}

// TestTourMatchesREADME: the README's tour and the script CI runs are the
// same commands in the same order (issue 23, C.1: the tour once removed
// models/llama before four commands used it, and nothing ran it). The
// README's "make build" is the one line the script leaves to its caller.
func TestTourMatchesREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	script, err := os.ReadFile("../scripts/tour.sh")
	require.NoError(t, err)
	want := tourCommands(t, string(readme))
	require.NotEmpty(t, want)
	require.Equal(t, "make build", want[0], "the README's tour starts with make build")
	assert.Equal(t, want[1:], tourScriptCommands(t, string(script)))
}

// tourBin is a directory with the kylix this test run built and the
// repository's C libraries (make build puts them in bin/).
func tourBin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Symlink(kylixBin, filepath.Join(dir, "kylix")))
	libs, _ := filepath.Glob("../bin/libkylix*.so")
	for _, l := range libs {
		abs, err := filepath.Abs(l)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(abs, filepath.Join(dir, filepath.Base(l))))
	}
	return dir
}

// runTour runs scripts/tour.sh with KYLIX_TOUR_BIN=bin and returns its
// output, its exit status, and the work directory and node pids it
// reported removing and stopping.
func runTour(t *testing.T, bin string) (out string, code int, work string, pids []int) {
	t.Helper()
	cmd := exec.Command("bash", "../scripts/tour.sh")
	cmd.Env = append(os.Environ(), "KYLIX_TOUR_BIN="+bin)
	b, err := cmd.CombinedOutput()
	out = string(b)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	removed := regexp.MustCompile(`^tour: removed (\S+?)(?:, stopped node ([\d ]+))?$`)
	for sc.Scan() {
		if m := removed.FindStringSubmatch(sc.Text()); m != nil {
			work = m[1]
			for _, f := range strings.Fields(m[2]) {
				p, err := strconv.Atoi(f)
				require.NoError(t, err)
				pids = append(pids, p)
			}
		}
	}
	return out, code, work, pids
}

// assertTourCleanedUp: nothing the tour made is left: its directory, a
// mount under it (also a dead node's, which mountpoint -q misses), its
// nodes and their client sockets.
func assertTourCleanedUp(t *testing.T, out, work string, pids []int, wantNodes int) {
	t.Helper()
	require.NotEmpty(t, work, "the tour did not say what it removed:\n%s", out)
	_, err := os.Stat(work)
	assert.True(t, os.IsNotExist(err), "%s is still there (%v)", work, err)
	mi, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mi), " "+work+"/", "a mount under the tour's directory is left")
	// Client sockets are named after the mount path (node.DefaultClientSocket).
	socks, _ := filepath.Glob("/run/kylix/" + strings.ReplaceAll(work, "/", "_") + "_*")
	assert.Empty(t, socks, "client sockets of the tour's nodes are left")
	assert.Len(t, pids, wantNodes, "nodes the tour stopped:\n%s", out)
	for _, p := range pids {
		assert.ErrorIs(t, syscall.Kill(p, 0), syscall.ESRCH, "node %d still runs", p)
	}
}

// TestTour runs the README's tour (scripts/tour.sh) against the kylix this
// test run built, in a data directory and mount point of its own: without
// root and /dev/fuse it stops before serve, without a GPU before load, and
// says so.
func TestTour(t *testing.T) {
	out, code, work, pids := runTour(t, tourBin(t))
	require.Equal(t, 0, code, "the tour failed:\n%s", out)
	assert.Contains(t, out, "\ntour: passed", out)
	nodes := 3
	if os.Geteuid() != 0 {
		assert.Contains(t, out, "tour: skipped: the rest of the tour: kylix serve mounts with FUSE: needs root")
		nodes = 0
	} else if _, err := os.Stat("/dev/nvidia0"); err != nil {
		assert.Contains(t, out, "tour: skipped: the rest of the tour: no NVIDIA GPU here (/dev/nvidia0)")
	}
	assertTourCleanedUp(t, out, work, pids, nodes)
	if skipped := grepLines(out, "tour: skipped:"); skipped != "" {
		t.Logf("skipped steps, as the tour says:\n%s", skipped)
		reportSkips(t, skipped)
	}
}

// TestTourCleansUpAfterFailure: a step that fails after its node died by
// kill -9 (its mount left ENOTCONN) still leaves nothing behind: the
// wrapper kylix below kills the node at "kylix top" and fails.
func TestTourCleansUpAfterFailure(t *testing.T) {
	requireFUSE(t)
	bin := tourBin(t)
	real := filepath.Join(bin, "kylix.real")
	require.NoError(t, os.Rename(filepath.Join(bin, "kylix"), real))
	wrapper := fmt.Sprintf(`#!/bin/sh
if [ "$1" = top ]; then
  pid=$(%[1]q node --json | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  echo "wrapper: killed node $pid with SIGKILL" >&2
  exit 1
fi
exec %[1]q "$@"
`, real)
	require.NoError(t, os.WriteFile(filepath.Join(bin, "kylix"), []byte(wrapper), 0o755))
	out, code, work, pids := runTour(t, bin)
	assert.NotEqual(t, 0, code, out)
	require.Contains(t, out, "wrapper: killed node", out)
	assert.Contains(t, out, "tour: FAILED")
	assertTourCleanedUp(t, out, work, pids, 1)
}

// reportSkips appends lines (what a passing test skipped, and why) to the
// file $KYLIX_TEST_SKIPLOG names, if set: make test's summary lists them
// (scripts/make-test.sh), where go test shows nothing of a passing test.
func reportSkips(t *testing.T, lines string) {
	path := os.Getenv("KYLIX_TEST_SKIPLOG")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("KYLIX_TEST_SKIPLOG: %v", err)
		return
	}
	defer f.Close()
	for _, l := range strings.Split(strings.TrimRight(lines, "\n"), "\n") {
		fmt.Fprintf(f, "%s: %s\n", t.Name(), l)
	}
}

func grepLines(s, substr string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
