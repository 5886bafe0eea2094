package test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportHFCacheThroughNode: with a node running, `kylix import --hf-cache`
// runs in the node, whose environment is not the caller's. The model id is
// resolved in the caller's environment ($HF_HOME here, set only for the
// client) and the node is handed the snapshot's path; the files read back
// through the mount are the blobs the snapshot links to.
func TestImportHFCacheThroughNode(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	home := t.TempDir()
	repo := filepath.Join(home, "hub", "models--org--tiny")
	commit := strings.Repeat("cd", 20)
	for _, d := range []string{"blobs", "refs", "snapshots/" + commit} {
		if err := os.MkdirAll(filepath.Join(repo, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := bytes.Repeat([]byte("weights "), 300000)
	if err := os.WriteFile(filepath.Join(repo, "blobs", "f00d"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../blobs/f00d", filepath.Join(repo, "snapshots", commit, "model.bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(commit), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", home) // the client's environment only: the node started before
	out := mustKylix(t, "/", "import", "--data", data, "--hf-cache", "org/tiny", "models/tiny")
	if !strings.Contains(out, "1 files") {
		t.Fatalf("import through the node:\n%s\n%s", out, n.log)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "models", "tiny", "model.bin"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("model.bin through the mount: %d bytes, %v", len(got), err)
	}
}
