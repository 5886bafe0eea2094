package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMakeTestSummary: make test (scripts/make-test.sh) ends with one
// summary: the steps that passed, the one that failed, those not run, and
// each skip a step reported, once (issue 23, C.6: make test printed
// thirteen "no GPU fill" lines that read as failures and no summary). A
// stand-in for make plays the steps.
func TestMakeTestSummary(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "make")
	require.NoError(t, os.WriteFile(fake, []byte(`#!/bin/sh
case "$2" in
lint) echo "staticcheck not installed; skipped (make tools)" ;;
test-c) for i in 1 2 3; do echo "skip: GPU fill into client memory: no GPU here"; done; echo "all tests passed"
  echo "TestTour: tour: skipped: the rest of the tour: no NVIDIA GPU here" >>"$KYLIX_TEST_SKIPLOG" ;;
test-unit) echo "--- FAIL: TestX"; exit 3 ;;
esac
`), 0o755))
	// Under `make test` itself the outer run's own log files are there
	// too: only files this test's runs made count.
	before, _ := filepath.Glob("../.make-test.*")
	run := func(steps ...string) (string, int) {
		cmd := exec.Command("bash", append([]string{"../scripts/make-test.sh"}, steps...)...)
		cmd.Env = append(os.Environ(), "MAKE="+fake)
		b, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(b), ee.ExitCode()
		}
		require.NoError(t, err)
		return string(b), 0
	}
	out, code := run("lint", "test-c")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "== make test: 2 of 2 steps ran in ")
	assert.Regexp(t, `passed:  lint \(\d+ s\), test-c \(\d+ s\)\n`, out)
	assert.Contains(t, out, "  lint: staticcheck not installed; skipped (make tools)\n  test-c: skip: GPU fill into client memory: no GPU here\n"+
		"  test-c: TestTour: tour: skipped: the rest of the tour: no NVIDIA GPU here\nmake test: PASS\n")

	out, code = run("lint", "test-unit", "test-c", "test-python")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "== make test: 2 of 4 steps ran in ")
	assert.Contains(t, out, "   FAILED:  test-unit (exit 3)\n   not run: test-c test-python\n")
	assert.NotContains(t, out, "== make test-c")
	assert.Contains(t, out, "make test: FAIL\n")
	after, _ := filepath.Glob("../.make-test.*")
	assert.Subset(t, before, after, "the summary's log files are left")
}
