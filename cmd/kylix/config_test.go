package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveFlagSet returns serve's flag set after parsing args as serve's
// command line (with --help at the end, so that serve stops there).
func serveFlagSet(t *testing.T, args ...string) *flags {
	t.Helper()
	return serveFlagSetEnv(t, nil, args...)
}

// serveFlagSetEnv is serveFlagSet with environment variables.
func serveFlagSetEnv(t *testing.T, environ map[string]string, args ...string) *flags {
	t.Helper()
	var got *flags
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard,
		getenv: func(k string) string { return environ[k] }, onFlags: func(f *flags) { got = f }}
	require.ErrorIs(t, runServe(context.Background(), e, append(args, "--help")), errHelp)
	require.NotNil(t, got)
	return got
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kylix.toml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

func flagValue(f *flags, name string) string { return f.Lookup(name).Value.String() }

// The file sets serve's flags by name, of every type; a list for join;
// relative paths from the file's directory.
func TestConfigSetsFlags(t *testing.T) {
	p := writeConfig(t, `
# a member
listen = "10.0.0.2:7946"
join = ["10.0.0.1:7946", "10.0.0.3:7946"]
cluster-key = "cluster.key"
mount = "/mnt/k"
node-name = "gpu-02"
replicas = 3
repair-rate = 1048576
failure-grace = "1m30s"
log-gossip = true
peer-cache = 0
data-plane = "plaintext"
`)
	f := serveFlagSet(t)
	set, err := applyConfig(f, p)
	require.NoError(t, err)
	assert.Len(t, set, 11)
	for k, want := range map[string]string{
		"listen": "10.0.0.2:7946", "join": "10.0.0.1:7946,10.0.0.3:7946",
		"cluster-key": filepath.Join(filepath.Dir(p), "cluster.key"), "mount": "/mnt/k", "node-name": "gpu-02",
		"replicas": "3", "repair-rate": "1048576", "failure-grace": "1m30s", "log-gossip": "true",
		"peer-cache": "0", "data-plane": "plaintext",
	} {
		assert.Equal(t, want, flagValue(f, k), k)
	}
	// Not in the file: the default.
	assert.Equal(t, "", flagValue(f, "zone"))
}

// A flag on the command line wins over the file; the file wins over the
// default.
func TestConfigCommandLineWins(t *testing.T) {
	p := writeConfig(t, "listen = \"10.0.0.2:7946\"\nreplicas = 3\nzone = \"a\"\nlog-gossip = true\n")
	f := serveFlagSet(t, "--listen", "10.9.9.9:1", "--replicas=5", "--log-gossip=false")
	set, err := applyConfig(f, p)
	require.NoError(t, err)
	assert.Equal(t, []string{"zone"}, set)
	assert.Equal(t, "10.9.9.9:1", flagValue(f, "listen"))
	assert.Equal(t, "5", flagValue(f, "replicas"))
	assert.Equal(t, "false", flagValue(f, "log-gossip"))
	assert.Equal(t, "a", flagValue(f, "zone"))
}

// The file wins over environment variables (they are defaults).
func TestConfigOverEnvironment(t *testing.T) {
	p := writeConfig(t, "data = \"/cfg/data\"\nmount = \"/cfg/mnt\"\n")
	f := serveFlagSetEnv(t, map[string]string{"KYLIX_DATA": "/env/data", "KYLIX_MOUNT": "/env/mnt"})
	assert.Equal(t, "/env/mnt", flagValue(f, "mount"))
	_, err := applyConfig(f, p)
	require.NoError(t, err)
	assert.Equal(t, "/cfg/data", f.data)
	assert.Equal(t, "/cfg/mnt", flagValue(f, "mount"))
}

// Every flag of serve can be set in the file (a value of its type: its
// default).
func TestConfigEveryServeFlag(t *testing.T) {
	f := serveFlagSet(t)
	var b strings.Builder
	n := 0
	f.VisitAll(func(fl *pflag.Flag) {
		if _, no := configNotSettable[fl.Name]; no {
			return
		}
		n++
		switch fl.Value.Type() {
		case "bool", "int", "int64":
			fmt.Fprintf(&b, "%s = %s\n", fl.Name, fl.DefValue)
		default:
			fmt.Fprintf(&b, "%s = %q\n", fl.Name, fl.DefValue)
		}
	})
	set, err := applyConfig(serveFlagSet(t), writeConfig(t, b.String()))
	require.NoError(t, err, b.String())
	assert.Len(t, set, n)
	assert.Greater(t, n, 20)
}

// The example shipped in docs/examples parses, and sets what it shows.
func TestConfigExample(t *testing.T) {
	p := filepath.Join("..", "..", "docs", "examples", "kylix.toml")
	f := serveFlagSet(t)
	set, err := applyConfig(f, p)
	require.NoError(t, err)
	assert.Contains(t, set, "listen")
	assert.Contains(t, set, "join")
	assert.Contains(t, set, "cluster-key")
	assert.Equal(t, "/etc/kylix/cluster.key", flagValue(f, "cluster-key"))
}

// Mistakes in the file stop serve before anything starts, naming the file
// and the key.
func TestConfigMistakes(t *testing.T) {
	key := strings.TrimSpace(runIn(t, t.TempDir(), "cluster-key").stdout)
	for _, c := range []struct{ text, want string }{
		{"lisen = \"10.0.0.2:7946\"\n", `unknown key "lisen"; did you mean "listen"? (the keys are`},
		{"cluster_key = \"k\"\n", `unknown key "cluster_key"; did you mean "cluster-key"?`},
		{"[cluster]\nlisten = \"10.0.0.2:7946\"\n", `unknown key "cluster"`},
		{"frobnicate = 1\n", `unknown key "frobnicate" (the keys are the flags of kylix serve`},
		{"replicas = \"two\"\n", `key "replicas": want an integer, got the string "two"`},
		{"log-gossip = \"yes\"\n", `key "log-gossip": want true or false, got the string "yes"`},
		{"failure-grace = 30\n", `key "failure-grace": want a duration in quotes ("30s", "2m"), got the integer 30`},
		{"failure-grace = \"30 seconds\"\n", `key "failure-grace": `},
		{"listen = [\"a\"]\n", `key "listen": want a string, got a list`},
		{"join = [1, 2]\n", `key "join": want a list of "HOST:PORT" strings, got the integer 1 in it`},
		{"config = \"other.toml\"\n", `key "config" cannot be set in a config file`},
		{"cluster-key = \"" + key + "\"\n", `key "cluster-key" holds a key; it names the file holding it`},
		{"listen = \"a\"\nlisten = \"b\"\n", `line 2: `},
		{"listen = \n", `line 1: `},
	} {
		p := writeConfig(t, c.text)
		r := runIn(t, t.TempDir(), "serve", "--config", p, "--mount", filepath.Join(t.TempDir(), "m"))
		assert.Equal(t, exitFailure, r.code, "%q: %s", c.text, r.stderr)
		assert.Contains(t, r.stderr, "config "+p+": ", "%q", c.text)
		assert.Contains(t, r.stderr, c.want, "%q", c.text)
	}
}

// A file every user may write is refused; a missing file is an error.
func TestConfigFileChecks(t *testing.T) {
	p := writeConfig(t, "zone = \"a\"\n")
	require.NoError(t, os.Chmod(p, 0o666))
	_, err := applyConfig(serveFlagSet(t), p)
	require.ErrorContains(t, err, "config file "+p+" is writable by every user (mode 0666): chmod o-w it")
	_, err = applyConfig(serveFlagSet(t), filepath.Join(t.TempDir(), "none.toml"))
	require.ErrorContains(t, err, "no such file")
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chmod(p, 0o644))
		require.NoError(t, os.Chown(p, 1000, 1000))
		_, err = applyConfig(serveFlagSet(t), p)
		require.ErrorContains(t, err, "belongs to uid 1000, and the node runs as root: chown root it")
	}
}

// As root, the file must also not be writable by its group, and no
// directory on its path may be writable by group or others (unless
// sticky) or owned by another user: each of them could replace the file.
// A symlink to the file is followed and the target's path checked too.
func TestConfigFileChecksRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the root-only checks need root")
	}
	p := writeConfig(t, "zone = \"a\"\n")
	dir := filepath.Dir(p)
	_, err := applyConfig(serveFlagSet(t), p)
	require.NoError(t, err, "a root 0644 file in a root 0700 directory under sticky /tmp")

	require.NoError(t, os.Chmod(p, 0o664))
	_, err = applyConfig(serveFlagSet(t), p)
	require.ErrorContains(t, err, "config file "+p+" is writable by its group (mode 0664), and the node runs as root: chmod go-w it")
	require.NoError(t, os.Chmod(p, 0o644))

	require.NoError(t, os.Chmod(dir, 0o775))
	_, err = applyConfig(serveFlagSet(t), p)
	require.ErrorContains(t, err, "config directory "+dir+" is writable by group or others (mode 0775)")
	require.ErrorContains(t, err, "whoever may write it can replace the config file: chmod go-w it")
	require.NoError(t, os.Chmod(dir, os.ModeSticky|0o777))
	_, err = applyConfig(serveFlagSet(t), p)
	require.NoError(t, err, "a sticky directory: others cannot rename or remove root's file")
	require.NoError(t, os.Chmod(dir, 0o755))

	require.NoError(t, os.Chown(dir, 1000, 1000))
	_, err = applyConfig(serveFlagSet(t), p)
	require.ErrorContains(t, err, "config directory "+dir+" belongs to uid 1000, and the node runs as root: chown root it")
	require.NoError(t, os.Chown(dir, 0, 0))

	// Through a symlink in a safe directory to a file in an unsafe one.
	bad := t.TempDir()
	require.NoError(t, os.Chmod(bad, 0o777))
	target := filepath.Join(bad, "real.toml")
	require.NoError(t, os.WriteFile(target, []byte("zone = \"b\"\n"), 0o644))
	link := filepath.Join(dir, "link.toml")
	require.NoError(t, os.Symlink(target, link))
	_, err = applyConfig(serveFlagSet(t), link)
	require.ErrorContains(t, err, "config directory "+bad+" is writable by group or others (mode 0777)")
}

// $KYLIX_CONFIG names the file when --config is not given; --config ""
// reads none.
func TestConfigPath(t *testing.T) {
	f := serveFlagSet(t)
	f.e.getenv = func(k string) string {
		if k == configEnv {
			return "/etc/kylix/kylix.toml"
		}
		return ""
	}
	assert.Equal(t, "/etc/kylix/kylix.toml", configPath(f, ""))
	g := serveFlagSet(t, "--config", "")
	g.e.getenv = f.e.getenv
	assert.Equal(t, "", configPath(g, ""))
	h := serveFlagSet(t, "--config", "x.toml")
	assert.Equal(t, "x.toml", configPath(h, "x.toml"))
}

func TestEditDistance(t *testing.T) {
	assert.Equal(t, 0, editDistance("cluster_key", "cluster-key"))
	assert.Equal(t, 1, editDistance("lisen", "listen"))
	assert.Equal(t, 3, editDistance("abc", ""))
}

// A list flag (cold-shards) takes a TOML list of strings, each one value.
func TestConfigListFlag(t *testing.T) {
	f := serveFlagSet(t)
	_, err := applyConfig(f, writeConfig(t, "cold-shards = [\"models=10\", \"datasets=6\"]\n"))
	require.NoError(t, err)
	v, err := f.GetStringSlice("cold-shards")
	require.NoError(t, err)
	assert.Equal(t, []string{"models=10", "datasets=6"}, v)
	_, err = applyConfig(serveFlagSet(t), writeConfig(t, "cold-shards = [6]\n"))
	require.ErrorContains(t, err, "want a list of strings")
}
