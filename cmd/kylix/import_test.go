package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hfCache lays out a Hugging Face hub cache entry the way huggingface_hub
// writes it: the files in blobs/ under content hashes, and a snapshot
// directory of relative links into ../../blobs. It returns the snapshot
// directory and the files the snapshot stands for, by name.
func hfCache(t *testing.T) (string, map[string][]byte) {
	t.Helper()
	src := demo(t)
	repo := filepath.Join(t.TempDir(), "hub", "models--org--tiny")
	blobs := filepath.Join(repo, "blobs")
	snap := filepath.Join(repo, "snapshots", "0123abcd")
	require.NoError(t, os.MkdirAll(blobs, 0o755))
	require.NoError(t, os.MkdirAll(snap, 0o755))
	want := map[string][]byte{}
	for i, name := range []string{"model-00001-of-00002.safetensors", "config.json"} {
		b, err := os.ReadFile(filepath.Join(src, "base", name))
		require.NoError(t, err)
		blob := []string{"9f2c1b", "77aa03"}[i]
		require.NoError(t, os.WriteFile(filepath.Join(blobs, blob), b, 0o644))
		require.NoError(t, os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, name)))
		want[name] = b
	}
	require.NoError(t, os.Symlink("../../blobs/gone", filepath.Join(snap, "dangling.bin")))
	require.NoError(t, os.Symlink("..", filepath.Join(snap, "up")))
	require.NoError(t, os.Symlink("config.json", filepath.Join(snap, "cfg")))
	return snap, want
}

// TestImportHFSnapshot: importing a Hugging Face cache snapshot stored its
// links into ../../blobs as links (dangling once outside the cache), printed
// "0 files, 0 B" and exited 0. Links out of the tree to files are now
// followed: the files are stored under the links' names (so format detection
// sees .safetensors), exported as regular files with the same bytes; links
// inside the tree stay links; links out of it to directories and dangling
// links stay links, each with a note; the summary counts both.
// --no-dereference keeps every link.
func TestImportHFSnapshot(t *testing.T) {
	snap, want := hfCache(t)
	data := t.TempDir()
	r := mustKylix(t, data, "import", snap, "models/tiny")
	require.Contains(t, r.stdout, "2 files")
	require.Contains(t, r.stdout, "2 followed (stored as the files they name), 3 kept as links")
	require.Contains(t, r.stderr, "dangling.bin: kept as a symlink: its target cannot be read")
	require.Contains(t, r.stderr, "up: kept as a symlink: it names a directory outside the tree")

	var so statOut
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "stat", "--json", "models/tiny/model-00001-of-00002.safetensors").stdout), &so))
	require.Equal(t, "safetensors", so.Format, "the link's name, not the blob's, decides the format")

	out := filepath.Join(t.TempDir(), "out")
	mustKylix(t, data, "export", "models/tiny", out)
	for name, b := range want {
		st, err := os.Lstat(filepath.Join(out, name))
		require.NoError(t, err)
		require.True(t, st.Mode().IsRegular(), "%s exported as %s, want a regular file", name, st.Mode().Type())
		got, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, b), "%s: bytes differ", name)
	}
	// A link inside the tree stays a link (and no note is made for it).
	require.NotContains(t, r.stderr, "cfg:")
	for _, name := range []string{"dangling.bin", "up", "cfg"} {
		st, err := os.Lstat(filepath.Join(out, name))
		require.NoError(t, err)
		require.Equal(t, os.ModeSymlink, st.Mode().Type(), name)
	}

	r = mustKylix(t, data, "import", "--no-dereference", snap, "models/links")
	require.Contains(t, r.stdout, "0 files")
	require.Contains(t, r.stdout, "0 followed (stored as the files they name), 5 kept as links")
	ls := mustKylix(t, data, "ls", "--json", "models/links").stdout
	require.Equal(t, 5, strings.Count(ls, `"symlink"`), ls)
}

// TestImportHFCacheByID: --hf-cache takes a model id as on the Hub and finds
// its snapshot in the local cache (--hf-cache-dir, or $HF_HUB_CACHE /
// $HF_HOME/hub as huggingface_hub does), through refs/ for a branch or
// directly for a commit hash; a model or revision not in the cache is a
// clear error that says what is there.
func TestImportHFCacheByID(t *testing.T) {
	snap, want := hfCache(t)
	repo := filepath.Dir(filepath.Dir(snap))
	hub := filepath.Dir(repo)
	commit := strings.Repeat("ab", 20)
	require.NoError(t, os.Rename(snap, filepath.Join(repo, "snapshots", commit)))
	require.NoError(t, os.MkdirAll(filepath.Join(repo, "refs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(commit+"\n"), 0o644))
	data := t.TempDir()

	r := mustKylix(t, data, "import", "--hf-cache", "--hf-cache-dir", hub, "org/tiny", "models/a")
	require.Contains(t, r.stdout, "2 files")
	mustKylix(t, data, "import", "--hf-cache", "--hf-cache-dir", hub, "org/tiny@"+commit, "models/b")

	cmd := kylixCmd(data, "import", "--hf-cache", "org/tiny@main", "models/c")
	cmd.Env = append(cmd.Env, "HF_HUB_CACHE=", "HF_HOME="+filepath.Dir(hub))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, d := range []string{"a", "b", "c"} {
		exp := filepath.Join(t.TempDir(), d)
		mustKylix(t, data, "export", "models/"+d, exp)
		for name, b := range want {
			got, err := os.ReadFile(filepath.Join(exp, name))
			require.NoError(t, err)
			require.True(t, bytes.Equal(got, b), "models/%s/%s", d, name)
		}
	}

	r = kylix(t, data, "import", "--hf-cache", "--hf-cache-dir", hub, "org/other", "models/x")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "org/other is not in the Hugging Face cache "+hub)
	r = kylix(t, data, "import", "--hf-cache", "--hf-cache-dir", hub, "org/tiny@v2", "models/x")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `has no revision "v2"`)
	require.Contains(t, r.stderr, "it has: "+commit+", main")
	r = kylix(t, data, "import", "--hf-cache", "--hf-cache-dir", hub, "tiny", "models/x")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "is not a model id")
}
