package chunkstore

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPathPolicyStore: policies by path are set (a path that does not
// exist too, the whole namespace too), replaced, listed and cleared (a
// tombstone); their directory is hidden and reserved in the namespace
// root, a reserved or invalid path is refused, and GC and verify take the
// namespace with them as it is.
func TestPathPolicyStore(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()
	_, _ = importModel(t, s, rnd(1<<20, 1))

	got, err := s.PathPolicies(PolicyColdShards)
	require.NoError(t, err)
	require.Empty(t, got, "none set")

	require.NoError(t, s.SetPathPolicy(PolicyColdShards, "/models/narrow/", "5"))
	require.NoError(t, s.SetPathPolicy(PolicyColdShards, "/", "8"))
	require.NoError(t, s.SetPathPolicy(PolicyColdShards, "data/a b.ü/x.tar", "10"))
	require.NoError(t, s.SetPathPolicy(PolicyColdShards, "models/narrow", "6"), "replaces")
	require.NoError(t, s.SetPathPolicy("other-kind", "models", "x"), "kinds are apart")
	got, err = s.PathPolicies(PolicyColdShards)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"models/narrow": "6", "": "8", "data/a b.ü/x.tar": "10"}, got)

	found, err := s.ClearPathPolicy(PolicyColdShards, "models/narrow")
	require.NoError(t, err)
	require.True(t, found)
	found, err = s.ClearPathPolicy(PolicyColdShards, "models/narrow")
	require.NoError(t, err)
	require.False(t, found, "cleared already")
	found, err = s.ClearPathPolicy(PolicyColdShards, "never/set")
	require.NoError(t, err)
	require.False(t, found)
	got, err = s.PathPolicies(PolicyColdShards)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"": "8", "data/a b.ü/x.tar": "10"}, got)
	d, err := s.reservedDir(PolicyDir)
	require.NoError(t, err)
	sub, err := s.dirAt(d.Entries[0].ID)
	require.NoError(t, err)
	i, ok := sub.Find("models%2Fnarrow")
	require.True(t, ok)
	require.True(t, sub.Entries[i].Deleted, "the removal is a tombstone, which merges")

	// A merge's conflict copy beside a policy is not a policy, and the
	// next set of that path removes it.
	require.NoError(t, s.Update(func(tx *NSTx) error {
		pd, err := tx.dir([]string{PolicyDir, PolicyColdShards}, false, true)
		require.NoError(t, err)
		pd.m.Put(Entry{Name: "%2F.conflict-17", Kind: KindSymlink, Mode: 0o777, Target: "7", Size: 1, HLC: tx.hlc})
		return nil
	}))
	got, err = s.PathPolicies(PolicyColdShards)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"": "8", "data/a b.ü/x.tar": "10"}, got)
	require.NoError(t, s.SetPathPolicy(PolicyColdShards, "", "9"))
	pd, err := s.reservedDir(PolicyDir)
	require.NoError(t, err)
	sub, err = s.dirAt(pd.Entries[0].ID)
	require.NoError(t, err)
	for _, e := range sub.Live() {
		require.NotContains(t, e.Name, ".conflict-")
	}

	// Refused: a reserved or invalid path, an empty or long value.
	for _, p := range []string{PolicyDir + "/x", LayoutDir, "a/../b", strings.Repeat("é", 100)} {
		require.ErrorIs(t, s.SetPathPolicy(PolicyColdShards, p, "5"), ErrInvalidPath, p)
	}
	require.ErrorIs(t, s.SetPathPolicy(PolicyColdShards, "a", ""), ErrInvalidPath)
	require.ErrorIs(t, s.SetPathPolicy(PolicyColdShards, "a", strings.Repeat("5", 65)), ErrInvalidPath)

	// Hidden and reserved.
	_, err = s.Lookup(PolicyDir)
	require.ErrorIs(t, err, ErrNotFound)
	root, err := s.List("")
	require.NoError(t, err)
	for _, e := range root {
		require.NotEqual(t, PolicyDir, e.Name)
	}
	require.True(t, ReservedRoot(PolicyDir))
	err = s.Update(func(tx *NSTx) error { return tx.Put(PolicyDir+"/x", Entry{Kind: KindDir}) })
	require.ErrorIs(t, err, ErrInvalidPath)
	err = s.Update(func(tx *NSTx) error { return tx.Remove(PolicyDir, true) })
	require.ErrorIs(t, err, ErrNotFound)
	err = s.Update(func(tx *NSTx) error { return tx.Rename("m", PolicyDir) })
	require.ErrorIs(t, err, ErrInvalidPath)

	_, err = s.GC(ctx)
	require.NoError(t, err)
	got, err = s.PathPolicies(PolicyColdShards)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"": "9", "data/a b.ü/x.tar": "10"}, got, "after GC")
	rep, err := s.Verify(ctx, "", nil)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v", rep.Problems)
}

// TestPolicyNames: the escaping of policy paths into entry names is
// one to one, and names it would not make are not read back.
func TestPolicyNames(t *testing.T) {
	for p, want := range map[string]string{
		"":              "%2F",
		"models/narrow": "models%2Fnarrow",
		"a.b/c_d-e":     "a%2Eb%2Fc_d-e",
		"%2F":           "%252F",
		"ü":             "%C3%BC",
	} {
		name, err := policyName(p)
		require.NoError(t, err)
		require.Equal(t, want, name, p)
		back, ok := unescapePolicyName(name)
		require.True(t, ok, name)
		require.Equal(t, p, back)
	}
	for _, name := range []string{"models%2fnarrow", "a%2", "%2F.conflict-1f", "a.b", "%2Fa", "a%2F", "a%2F%2Fb", "%2E%2E"} {
		_, ok := unescapePolicyName(name)
		require.False(t, ok, name)
	}
}
