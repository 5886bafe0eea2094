package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// The kernel keeps names, attributes (1 h), file pages (FOPEN_KEEP_CACHE)
// and directory listings (FOPEN_CACHE_DIR) of the mount
// (docs/design/fs.md, "Caching"). These tests change what is cached
// behind the mount's back, or through it, and check that another process
// never sees the old state afterwards. Each names the invalidation it
// depends on.

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// catOut reads p in another process.
func catOut(t *testing.T, p string) string {
	t.Helper()
	out, err := exec.Command("cat", p).CombinedOutput()
	if err != nil {
		t.Fatalf("cat %s: %v: %s", p, err, out)
	}
	return string(out)
}

// TestCachedListingFollowsImportAndRm: a listing the kernel cached shows a
// name an import added and loses one an rm took away (Reconcile drops the
// cached listing of every directory whose manifest changed; without it the
// kernel answers the second listing from its cache).
func TestCachedListingFollowsImportAndRm(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "m", map[string][]byte{"x": []byte("x"), "y": []byte("y"), "sub/a": []byte("a")})
	dir := filepath.Join(m.Dir, "m")
	for range 2 { // the second listing comes from the kernel's cache
		if got := names(t, dir); !slices.Equal(got, []string{"sub", "x", "y"}) {
			t.Fatalf("listing: %v", got)
		}
	}
	names(t, filepath.Join(dir, "sub"))
	if err := m.Store.Update(func(tx *chunkstore.NSTx) error {
		e, err := tx.Lookup("m/x")
		if err != nil {
			return err
		}
		if err := tx.Put("m/z", e); err != nil {
			return err
		}
		return tx.Put("m/sub/b", e)
	}); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	if got := names(t, dir); !slices.Equal(got, []string{"sub", "x", "y", "z"}) {
		t.Errorf("listing after an import added z: %v", got)
	}
	if got := names(t, filepath.Join(dir, "sub")); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("listing of sub after an import added b: %v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "y")); err != nil {
		t.Fatal(err)
	}
	if err := m.Store.Update(func(tx *chunkstore.NSTx) error { return tx.Remove("m/y", false) }); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	if got := names(t, dir); !slices.Equal(got, []string{"sub", "x", "z"}) {
		t.Errorf("listing after rm y: %v", got)
	}
	if out, err := exec.Command("stat", filepath.Join(dir, "y")).CombinedOutput(); err == nil || !strings.Contains(string(out), "No such file") {
		t.Errorf("stat y after rm: %v %s", err, out)
	}
}

// TestCachedPagesFollowImport: another process read a file (its pages and
// attributes are cached, for an hour); an import puts a new version of
// the same size at its name; the next reader gets the new bytes (Reconcile
// invalidates the name, NOTIFY_INVAL_ENTRY, and the lookup that follows
// gives the new version a new inode, with no cached pages).
func TestCachedPagesFollowImport(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "m", map[string][]byte{"x": []byte("version one")})
	p := filepath.Join(m.Dir, "m", "x")
	for range 2 {
		if got := catOut(t, p); got != "version one" {
			t.Fatalf("read: %q", got)
		}
	}
	importTree(t, m, "m", map[string][]byte{"x": []byte("version 2!!")})
	if got := catOut(t, p); got != "version 2!!" {
		t.Errorf("read after an import of a new version: %q", got)
	}
}

// TestWriteSeenByOtherProcess: after a write through the mount and its
// close, another process sees the new size and bytes, before and after
// the commit (the kernel updates its own attributes and pages from the
// write; nothing of the old version is served from a cache).
func TestWriteSeenByOtherProcess(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "m", map[string][]byte{"x": []byte("short")})
	p := filepath.Join(m.Dir, "m", "x")
	if got := catOut(t, p); got != "short" {
		t.Fatalf("read: %q", got)
	}
	for i, want := range []string{"a longer version of x", "tiny"} {
		if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, when := range []string{"closed", "committed"} {
			if when == "committed" {
				if err := m.FS.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			out, err := exec.Command("stat", "-c", "%s", p).Output()
			if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(len(want)) {
				t.Errorf("write %d, %s: stat size %q %v, want %d", i, when, out, err, len(want))
			}
			if got := catOut(t, p); got != want {
				t.Errorf("write %d, %s: read %q, want %q", i, when, got, want)
			}
		}
	}
}

// TestModeChangeAppliesToOthers: uid 65534 reads a file of mode 0644; its
// mode then changes behind the mount (an import of the same content with
// mode 0600: same version, new metadata) and 65534 is refused (Reconcile
// invalidates the name, the lookup refreshes the cached attributes, which
// the kernel checks permissions against: default_permissions); a chmod
// through the mount applies to 65534 at once both ways.
func TestModeChangeAppliesToOthers(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	openUp(t, m.Dir)
	importTree(t, m, "m", map[string][]byte{"x": []byte("secret")})
	p := filepath.Join(m.Dir, "m", "x")
	read := func() error {
		return as(nobody, func() error { _, err := os.ReadFile(p); return err })
	}
	if err := read(); err != nil {
		t.Fatalf("65534 reads a 0644 file: %v", err)
	}
	if err := m.Store.Update(func(tx *chunkstore.NSTx) error {
		e, err := tx.Lookup("m/x")
		if err != nil {
			return err
		}
		e.Mode = 0o600
		return tx.Put("m/x", e)
	}); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	if err := read(); errnoOf(err) != syscall.EACCES {
		t.Errorf("65534 after the mode became 0600 behind the mount: %v, want EACCES", err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := read(); err != nil {
		t.Errorf("65534 after chmod 0644 through the mount: %v", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := read(); errnoOf(err) != syscall.EACCES {
		t.Errorf("65534 after chmod 0600 through the mount: %v, want EACCES", err)
	}
}
