package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestImportExportFallbacks: with neither openat2 (kernels before 5.6) nor
// /proc mounted, import and export take their fallbacks (per-component
// O_NOFOLLOW openat; reopening a file by name and checking its inode) and
// store and write the same tree.
func TestImportExportFallbacks(t *testing.T) {
	noOpenat2.Store(true)
	procSelfFD = "/nonexistent/proc/self/fd/"
	t.Cleanup(func() { noOpenat2.Store(false); procSelfFD = "/proc/self/fd/" })

	src := t.TempDir()
	want := writeTree(t, src, map[string]int{"f": 5000, "d/g": 300}, 3)
	outside := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(outside, []byte("followed\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(src, "out"))
	os.Symlink("f", filepath.Join(src, "in"))
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	res, err := s.Import(ctx, src, "m", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 3 || res.Followed != 1 || res.Symlinks != 1 {
		t.Fatalf("import: %+v", res)
	}
	dest := filepath.Join(t.TempDir(), "x")
	if _, _, err := s.Export(ctx, "m", dest, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, b := range want {
		if got, err := os.ReadFile(filepath.Join(dest, name)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dest, "out")); err != nil || string(b) != "followed\n" {
		t.Fatalf("followed link: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(dest, "out")); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("followed link's mode: %v %v", st, err)
	}
	if l, err := os.Readlink(filepath.Join(dest, "in")); err != nil || l != "f" {
		t.Fatalf("link inside the tree: %q %v", l, err)
	}
	// A file exported onto an existing directory goes into it.
	if _, _, err := s.Export(ctx, "m/f", filepath.Join(dest, "d"), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "d", "f")); err != nil || !bytes.Equal(got, want["f"]) {
		t.Fatalf("file into a directory: %v", err)
	}
}

// TestExportDestinationSymlinks: run as root, a symlink on the way to the
// destination is followed when root owns it and refused when another user
// does (ErrUnsafeSymlink), before anything is written.
func TestExportDestinationSymlinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the rule is root's")
	}
	src := t.TempDir()
	writeTree(t, src, map[string]int{"f": 100}, 4)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	real := filepath.Join(base, "real")
	os.Mkdir(real, 0o755)
	os.Symlink(real, filepath.Join(base, "roots"))
	os.Symlink(real, filepath.Join(base, "users"))
	if err := os.Lchown(filepath.Join(base, "users"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Export(ctx, "m", filepath.Join(base, "roots", "a"), ExportOptions{}); err != nil {
		t.Fatalf("through root's symlink: %v", err)
	}
	_, _, err := s.Export(ctx, "m", filepath.Join(base, "users", "b"), ExportOptions{})
	if !errors.Is(err, ErrUnsafeSymlink) {
		t.Fatalf("through uid 65534's symlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(real, "b")); err == nil {
		t.Fatal("written through uid 65534's symlink")
	}
	// The relative form, with "..", resolves against the directories
	// actually reached.
	t.Chdir(filepath.Join(real, "a"))
	if _, _, err := s.Export(ctx, "m/f", "../../roots/c", ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(real, "c")); err != nil {
		t.Fatal(err)
	}
}
