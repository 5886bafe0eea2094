package test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
)

// TestFirstOpenAfterStartServedByNode: through `kylix serve`, a large file
// (40 MiB, above chunkstore.InlineCheckMax) whose pack has no check record
// is served by the node at its first open, without the whole-pack hash; a
// whole read by the node records the check (0 B hashed by the check), the
// next open is passthrough, and a node restarted after kill -9 trusts that
// record for the unchanged pack (docs/design/verification.md).
func TestFirstOpenAfterStartServedByNode(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	work := t.TempDir()
	content := make([]byte, 40<<20)
	r := rand.New(rand.NewPCG(35, 36))
	for i := range content {
		content[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(filepath.Join(work, "big"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	mustKylix(t, work, "import", "--data", data, "big", "m/big")
	// Paced at 1 MiB/s, the background check waits half a minute before
	// its first read: only the node's own read can prove the pack here.
	n := launchNode(t, data, mnt, nil, nil, "--scrub-rate", "1048576")
	p := filepath.Join(mnt, "m/big")
	if out := mustKylix(t, work, "stat", "--data", data, "m/big"); !strings.Contains(out, "the node, until the pack check finishes") {
		t.Fatalf("stat before the first open:\n%s", out)
	}
	buf := make([]byte, 256)
	if m, err := unix.Getxattr(p, "user.kylix.path", buf); err != nil || !strings.Contains(string(buf[:m]), "until the pack check finishes") {
		t.Fatalf("user.kylix.path = %q, %v", buf[:m], err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("first read: %v", err)
	}
	if out := mustKylix(t, work, "node", "--data", data); !strings.Contains(out, "opens:    0 by passthrough, 1 by the node") ||
		!strings.Contains(out, "checks:   1 packs passed, 0 failed before passthrough (0 B hashed)") {
		t.Fatalf("the first open waited for a check, or the node's read did not count as one:\n%s", out)
	}
	if got, err = os.ReadFile(p); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("second read: %v", err)
	}
	if out := mustKylix(t, work, "node", "--data", data); !strings.Contains(out, "opens:    1 by passthrough, 1 by the node") {
		t.Fatalf("the open after the recorded check was not passthrough:\n%s", out)
	}
	n.kill9()
	launchNode(t, data, mnt, nil, nil, "--scrub-rate", "1048576")
	if got, err = os.ReadFile(p); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read after kill -9 and restart: %v", err)
	}
	if out := mustKylix(t, work, "node", "--data", data); !strings.Contains(out, "opens:    1 by passthrough, 0 by the node") ||
		!strings.Contains(out, "checks:   0 packs passed") {
		t.Fatalf("restart did not trust the record made by the node's reads:\n%s", out)
	}
}

// TestFillVerifiedEveryChunkCountsAsCheck: a GPU FILL through the node (the
// stub CUDA driver) of a whole 40 MiB file whose pack has no check record
// reads and hashes every chunk of the pack in gpuio: that counts as the
// check (0 B hashed by the check itself), and the next open is
// passthrough.
func TestFillVerifiedEveryChunkCountsAsCheck(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	want := randomBytes(40<<20+321, 37)
	importFiles(t, data, map[string][]byte{"big": want})
	n, sock := startStubGPUNode(t, data, mnt, "--scrub-rate", "1048576")
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "m/big"))
	a := newShmAlloc(t, 41<<20)
	r := c.req(clientproto.OpFill, fillReq(a, 0, 0, uint64(len(want))), int(f.Fd()))
	if r.status != 0 {
		t.Fatalf("FILL: %d %s\n%s", r.status, r.msg, n.log)
	}
	if !bytes.Equal(a.bytes(t)[:len(want)], want) {
		t.Fatal("the allocation does not hold the file's bytes")
	}
	f.Close()
	work := t.TempDir()
	if out := mustKylix(t, work, "node", "--data", data); !strings.Contains(out, "opens:    0 by passthrough, 1 by the node (0 reads") ||
		!strings.Contains(out, "checks:   1 packs passed, 0 failed before passthrough (0 B hashed)") {
		t.Fatalf("a FILL that verified every chunk did not count as the pack's check:\n%s", out)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "m/big")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after the FILL: %v", err)
	}
	if out := mustKylix(t, work, "node", "--data", data); !strings.Contains(out, "opens:    1 by passthrough, 1 by the node") {
		t.Fatalf("the open after the FILL was not passthrough:\n%s", out)
	}
}
