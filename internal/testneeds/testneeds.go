// Package testneeds is how a test says that a real client it needs is
// missing: fuse3 (/dev/fuse, fusermount3), a C compiler, Debian's
// python3-torch and python3-numpy, setpriv, systemd-analyze, mkfs.ext4.
//
// A missing client fails the test, naming what to install, so that a run
// that could not test something never reads as a pass. `make test` installs
// every client first when it runs as root where apt-get is
// (scripts/test-deps.sh). KYLIX_TEST_ALLOW_SKIP=1 turns these failures into
// skips, for a machine where a client cannot be had. A missing GPU is not a
// missing client: GPU tests skip without one, as before.
package testneeds

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// AllowSkipEnv names the variable that, set to 1, lets a test skip when a
// client it needs is missing instead of failing.
const AllowSkipEnv = "KYLIX_TEST_ALLOW_SKIP"

// SkipAllowed reports whether KYLIX_TEST_ALLOW_SKIP=1 is set.
func SkipAllowed() bool { return os.Getenv(AllowSkipEnv) == "1" }

// Missing ends the test: a failure saying which client is missing and how to
// get it, or, with KYLIX_TEST_ALLOW_SKIP=1, a skip saying the same.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if SkipAllowed() {
		tb.Skipf("missing client (skipped: %s=1): %s", AllowSkipEnv, msg)
	}
	tb.Fatalf("missing client: %s\n(`make test` as root installs the test clients: scripts/test-deps.sh; %s=1 skips instead)", msg, AllowSkipEnv)
}

// Command returns the path of the program name, or ends the test through
// Missing, naming the Debian package that provides it.
func Command(tb testing.TB, name, debianPackage string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(tb, "%s not found (apt-get install -y %s)", name, debianPackage)
	}
	return p
}

// FUSE ends the test through Missing unless /dev/fuse exists.
func FUSE(tb testing.TB) {
	tb.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		Missing(tb, "FUSE: %v (load the fuse module, or give the container /dev/fuse; apt-get install -y fuse3)", err)
	}
}

// Python returns the first Python interpreter that imports every module:
// $KYLIX_TEST_PYTHON, else python3 on PATH, else /usr/bin/python3 (Debian's,
// where python3-torch installs). The error says which were tried and why
// each failed.
func Python(modules ...string) (string, error) {
	var cands []string
	if p := os.Getenv("KYLIX_TEST_PYTHON"); p != "" {
		cands = append(cands, p)
	}
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	cands = append(cands, "/usr/bin/python3")
	code := "import " + strings.Join(modules, ", ")
	var why []string
	seen := map[string]bool{}
	for _, p := range cands {
		if seen[p] {
			continue
		}
		seen[p] = true
		out, err := exec.Command(p, "-c", code).CombinedOutput()
		if err == nil {
			return p, nil
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		why = append(why, fmt.Sprintf("%s: %s", p, lines[len(lines)-1]))
	}
	return "", fmt.Errorf("no python3 here imports %s (%s)", strings.Join(modules, ", "), strings.Join(why, "; "))
}
