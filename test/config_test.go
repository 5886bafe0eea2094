package test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeMemberConfig writes a config file for one member into a directory
// of its own, the cluster key beside it (named by a relative path), and
// returns the file and the member's data and mount directories.
func writeMemberConfig(t *testing.T, key, listen, name string, join ...string) (cfg, data, mnt string) {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster.key"), b, 0o600))
	data, mnt = filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	text := fmt.Sprintf("data = %q\nmount = %q\nlisten = %q\ncluster-key = \"cluster.key\"\nnode-name = %q\nlog-gossip = true\nreplicas = 2\nfailure-grace = \"20s\"\n",
		data, mnt, listen, name)
	if len(join) > 0 {
		text += "join = ["
		for i, j := range join {
			if i > 0 {
				text += ", "
			}
			text += fmt.Sprintf("%q", j)
		}
		text += "]\n"
	}
	cfg = filepath.Join(dir, "kylix.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(text), 0o644))
	return cfg, data, mnt
}

// startConfigured runs `kylix serve` with the arguments and environment
// only (no --data, --mount or cluster flag: the config file gives them),
// and waits until its mount and admin socket answer.
func startConfigured(t *testing.T, data, mnt string, env []string, args ...string) *node {
	t.Helper()
	return launchServe(t, data, mnt, env, nil, args...)
}

// TestClusterFromConfig: two members whose every setting (data, mount,
// listen, join, cluster key by a path relative to the file, name) comes
// from a config file, one given by --config, the other by $KYLIX_CONFIG
// with --node-name on the command line winning over the file's: they see
// each other alive under those names, and a file imported on one reads
// byte-equal through the other's mount.
func TestClusterFromConfig(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	addrA, addrB := gossipAddr(t, "127.0.0.80"), gossipAddr(t, "127.0.0.81")
	cfgA, dataA, mntA := writeMemberConfig(t, key, addrA, "cfg-a")
	cfgB, dataB, mntB := writeMemberConfig(t, key, addrB, "from-file", addrA)
	a := &member{node: startConfigured(t, dataA, mntA, nil, "--config", cfgA), addr: addrA}
	b := &member{node: startConfigured(t, dataB, mntB, []string{"KYLIX_CONFIG=" + cfgB}, "--node-name", "cfg-b"), addr: addrB}
	for _, m := range []*member{a, b} {
		waitFor(t, membershipWait, "cfg-a and cfg-b alive", func() bool {
			ps := peersOf(t, m)
			return len(ps) == 2 && ps["cfg-a"].State == "alive" && ps["cfg-b"].State == "alive"
		})
	}
	require.Contains(t, b.log.String(), "settings from the config file")

	src, sum := randomFile(t, 3<<20+11)
	mustKylix(t, "/", "import", "--data", a.data, src, "c.bin")
	onB := filepath.Join(b.mnt, "c.bin")
	waitFor(t, 30*time.Second, "c.bin in b's mount", visible(onB))
	require.Equal(t, sum, shaOn(t, b, onB))
}
