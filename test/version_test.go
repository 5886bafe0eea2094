package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVersionStamp: make build stamps the commit into kylix --version
// (issue 23, C.5), whatever GOFLAGS says about -buildvcs: a release tag,
// else Go's own pseudo-version form v0.0.0-DATE-COMMIT12; a tarball made by
// git archive still knows its commit (export-subst in scripts/version.sh).
func TestVersionStamp(t *testing.T) {
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	revOut, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): nothing to stamp from", err)
	}
	rev := strings.TrimSpace(string(revOut))

	bin := filepath.Join(t.TempDir(), "kylix")
	// -o libkylix: the C library is not what this test is about.
	mk := exec.Command("make", "-s", "-C", repo, "-o", "libkylix", "build", "BIN="+bin)
	// Not the flags of a make test this runs under (its jobserver, its
	// variables).
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" && k != "GOFLAGS" {
			mk.Env = append(mk.Env, kv)
		}
	}
	mk.Env = append(mk.Env, "GOFLAGS=-buildvcs=false")
	b, err := mk.CombinedOutput()
	require.NoError(t, err, "make build: %s", b)
	out, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	assert.Regexp(t, `^kylix (v\d+\.\d+\.\d+\S*|v0\.0\.0-\d{14}-`+rev[:12]+`(\+dirty)?) \(go`, string(out))
	out, err = exec.Command(bin, "version", "--json").Output()
	require.NoError(t, err)
	var v struct {
		Version, Revision, Time string
	}
	require.NoError(t, json.Unmarshal(out, &v), "%s", out)
	assert.Equal(t, rev, v.Revision)
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, v.Time)

	// A tarball: no .git, and the line git archive filled in.
	dir := t.TempDir()
	arch := exec.Command("sh", "-c", `git -C "$1" archive HEAD scripts/version.sh | tar -x -C "$2"`, "sh", repo, dir)
	b, err = arch.CombinedOutput()
	require.NoError(t, err, "%s", b)
	cmd := exec.Command("bash", filepath.Join(dir, "scripts", "version.sh"))
	cmd.Env = append(os.Environ(), "GIT_DIR="+filepath.Join(dir, "no-such-git"), "GIT_CEILING_DIRECTORIES="+dir)
	b, err = cmd.Output()
	require.NoError(t, err)
	assert.Regexp(t, regexp.MustCompile(`^-X main.version=v0\.0\.0-\d{14}-`+rev[:12]+` -X main.revision=`+rev+` -X main.buildTime=\S+\n$`), string(b))
}
