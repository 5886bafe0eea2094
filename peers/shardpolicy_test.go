package peers

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestShardRules: the k a conversion applies to a file is that of the
// longest path at or above it across the cluster's rules (the namespace's)
// and the member's own (--cold-shards); for the same path the member's
// wins. A cluster rule whose K is not allowed leaves its files with an
// error naming it, never a guessed k, unless the member's own rule for
// that path replaces it or a longer path decides.
func TestShardRules(t *testing.T) {
	own, err := ParseShardPolicy([]string{"models=8", "models/big=10", "bad=6"})
	require.NoError(t, err)
	r := mergeShardRules(map[string]string{
		"":              "6",
		"models":        "5", // the member's 8 wins here
		"models/narrow": "5", // longer than the member's models
		"data":          "7",
		"bad":           "3", // replaced by the member's 6
		"broken":        "x",
		"broken/fixed":  "9",
	}, own)
	for p, want := range map[string]int{
		"top.bin":             6,
		"models/a.bin":        8,
		"models/narrow/x.bin": 5,
		"models/narrowly.bin": 8,
		"models/big/y.bin":    10,
		"data/s.tar":          7,
		"bad/z":               6,
		"broken/fixed/ok":     9,
	} {
		k, err := r.forFile(p)
		require.NoError(t, err, p)
		require.Equal(t, want, k, p)
	}
	_, err = r.forFile("broken/b.bin")
	require.ErrorContains(t, err, `the cluster's rule for /broken (kylix tier shards) is not one allowed: k "x" is not a number`)

	// No rule anywhere: the cluster's default.
	none := mergeShardRules(nil, nil)
	k, err := none.forFile("any/file")
	require.NoError(t, err)
	require.Zero(t, k)
	for _, text := range []string{"4", "11", "0", "-5"} {
		_, err := mergeShardRules(map[string]string{"m": text}, nil).forFile("m/f")
		require.ErrorContains(t, err, "want 5 to 10 data shards", text)
	}
}

// TestShardRulesMerge: rules set on two members at once (their stores)
// merge like files: both paths survive, one write wins on both for the
// same path (the later: the merge's rule), and a removal on one removes
// it on the other.
func TestShardRulesMerge(t *testing.T) {
	open := func() *chunkstore.Store {
		s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	// a pulls b's namespace into its own, as mergeFrom does.
	pull := func(a, b *chunkstore.Store) {
		t.Helper()
		remote, _, err := b.Root()
		require.NoError(t, err)
		var objs [][]byte // b's directories a lacks, as fetchTree brings them
		var walk func(id chunkstore.ID)
		walk = func(id chunkstore.ID) {
			d, err := b.DirManifest(id)
			require.NoError(t, err)
			objs = append(objs, d.Encode())
			for _, e := range d.Entries {
				if e.Kind == chunkstore.KindDir && !e.Deleted {
					walk(e.ID)
				}
			}
		}
		walk(remote)
		get := func(id chunkstore.ID) (*chunkstore.DirManifest, error) {
			if id == emptyDirID {
				return &chunkstore.DirManifest{}, nil
			}
			if d, err := a.DirManifest(id); err == nil {
				return d, nil
			}
			return b.DirManifest(id)
		}
		require.NoError(t, a.MergeNamespace(func(local chunkstore.ID) (chunkstore.ID, [][]byte, error) {
			id, err := mergeTrees(local, remote, get, nil, &objs)
			return id, objs, err
		}))
	}
	rules := func(s *chunkstore.Store) map[string]string {
		t.Helper()
		got, err := s.PathPolicies(chunkstore.PolicyColdShards)
		require.NoError(t, err)
		return got
	}
	require.NoError(t, a.SetPathPolicy(chunkstore.PolicyColdShards, "models/narrow", "5"))
	require.NoError(t, b.SetPathPolicy(chunkstore.PolicyColdShards, "data", "7"))
	require.NoError(t, b.SetPathPolicy(chunkstore.PolicyColdShards, "same", "6"))
	require.NoError(t, a.SetPathPolicy(chunkstore.PolicyColdShards, "same", "9"))
	pull(a, b)
	pull(b, a)
	// The same path set on both: one value wins on both (the merge's
	// rule), and the loser's conflict copy is no rule.
	same := rules(a)["same"]
	require.Contains(t, []string{"6", "9"}, same)
	want := map[string]string{"models/narrow": "5", "data": "7", "same": same}
	require.Equal(t, want, rules(a))
	require.Equal(t, want, rules(b))

	found, err := b.ClearPathPolicy(chunkstore.PolicyColdShards, "models/narrow")
	require.NoError(t, err)
	require.True(t, found)
	pull(a, b)
	require.Equal(t, map[string]string{"data": "7", "same": same}, rules(a))
}
