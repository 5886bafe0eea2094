package test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMountWritesSurviveIndexLoss: files written through the mount are in
// the packs' metadata log, so after index.db is lost the node refuses to
// start (saying what to run, deleting nothing), `kylix fsck --rebuild-index`
// recreates the index, and the restarted node serves every byte again.
func TestMountWritesSurviveIndexLoss(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	r := rand.New(rand.NewPCG(3, 4))
	want := map[string][]byte{}
	for name, size := range map[string]int{"small.txt": 1000, "dir/big.bin": 3<<20 + 17, "dir/sub/x": 70000} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		p := filepath.Join(mnt, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		want[name] = b
	}
	if err := os.Rename(filepath.Join(mnt, "dir", "sub", "x"), filepath.Join(mnt, "dir", "x-renamed")); err != nil {
		t.Fatal(err)
	}
	want["dir/x-renamed"] = want["dir/sub/x"]
	delete(want, "dir/sub/x")
	// The rebuild refuses while the node holds the store.
	if _, errs, code := kylix(t, data, "fsck", "--data", data, "--rebuild-index"); code == 0 || !strings.Contains(errs, "in use") {
		t.Fatalf("rebuild under a running node: exit %d %s", code, errs)
	}
	n.stop()

	if err := os.Remove(filepath.Join(data, "index.db")); err != nil {
		t.Fatal(err)
	}
	packs, _ := filepath.Glob(filepath.Join(data, "packs", "*"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kylixBin, "serve", "--data", data, "--mount", mnt)
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "kylix fsck --rebuild-index") {
		t.Fatalf("serve without an index: %v (timeout %v)\n%s", err, ctx.Err(), out)
	}
	if isMounted(mnt) {
		t.Fatal("serve mounted without an index")
	}
	if after, _ := filepath.Glob(filepath.Join(data, "packs", "*")); strings.Join(after, " ") != strings.Join(packs, " ") {
		t.Fatalf("packs changed: %v -> %v", packs, after)
	}
	mustKylix(t, data, "fsck", "--data", data, "--rebuild-index")
	startNode(t, data, mnt)
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s after rebuild: %d bytes, %v", name, len(got), err)
		}
	}
	if _, err := os.Stat(filepath.Join(mnt, "dir", "sub", "x")); !os.IsNotExist(err) {
		t.Fatalf("the renamed file is back under its old name: %v", err)
	}
	mustKylix(t, data, "verify", "--data", data)
	mustKylix(t, data, "fsck", "--data", data)
}
