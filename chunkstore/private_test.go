package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kylix/kylix/internal/testneeds"
)

// asNobody runs a command as uid/gid 65534 with no supplementary groups.
func asNobody(t *testing.T, args ...string) error {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	testneeds.Command(t, "setpriv", "util-linux")
	cmd := exec.Command("setpriv", append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups"}, args...)...)
	return cmd.Run()
}

// openableDir makes every directory from dir up to / searchable by others,
// so that only the store's own modes stand between another user and it.
func openableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func checkModes(t *testing.T, dir string) {
	t.Helper()
	want := map[string]fs.FileMode{dir: 0o700, filepath.Join(dir, "packs"): 0o700, filepath.Join(dir, "index.db"): 0o600, filepath.Join(dir, "LOCK"): 0o600}
	ents, err := os.ReadDir(filepath.Join(dir, "packs"))
	if err != nil {
		t.Fatal(err)
	}
	packs := 0
	for _, e := range ents {
		want[filepath.Join(dir, "packs", e.Name())] = 0o600
		if strings.HasSuffix(e.Name(), ".pack") {
			packs++
		}
	}
	if packs == 0 {
		t.Fatal("no packs: nothing checked")
	}
	for p, m := range want {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != m {
			t.Errorf("%s is %o, want %o", p, st.Mode().Perm(), m)
		}
	}
}

// TestStoreIsPrivate: packs, logs and the index are readable by the node's
// user only; another local user can read neither a secret's bytes from a
// pack nor names from the index. Wrong modes are fixed at open.
func TestStoreIsPrivate(t *testing.T) {
	base := openableDir(t)
	dir := filepath.Join(base, "data")
	src := filepath.Join(base, "src")
	os.MkdirAll(src, 0o700)
	secret := bytes.Repeat([]byte("TOP-SECRET-TOKEN "), 100)
	os.WriteFile(filepath.Join(src, "secret.txt"), secret, 0o600)
	s, err := Open(Options{Dir: dir, IO: "pread"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), src, "private", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	checkModes(t, dir)
	// Even with the directories opened up, the files themselves refuse.
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Join(dir, "packs"), 0o755)
	ents, _ := os.ReadDir(filepath.Join(dir, "packs"))
	for _, e := range ents {
		if err := asNobody(t, "cat", filepath.Join(dir, "packs", e.Name())); err == nil {
			t.Fatalf("uid 65534 read %s", e.Name())
		}
	}
	if err := asNobody(t, "cat", filepath.Join(dir, "index.db")); err == nil {
		t.Fatal("uid 65534 read index.db")
	}
	// A store left with loose modes (an older kylix made packs 0644 in
	// 0755 directories) is fixed at open, with a warning.
	for _, e := range ents {
		os.Chmod(filepath.Join(dir, "packs", e.Name()), 0o644)
	}
	os.Chmod(filepath.Join(dir, "index.db"), 0o644)
	if err := asNobody(t, "cat", filepath.Join(dir, "index.db")); err != nil {
		t.Fatal("the test setup did not open the index to others")
	}
	var logged bytes.Buffer
	s, err = Open(Options{Dir: dir, IO: "pread", Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if !strings.Contains(logged.String(), "permissions fixed") {
		t.Fatalf("no warning logged: %q", logged.String())
	}
	checkModes(t, dir)
	if err := asNobody(t, "cat", filepath.Join(dir, "index.db")); err == nil {
		t.Fatal("uid 65534 still reads index.db after the fix")
	}
}

// TestExportNeverFollowsSymlinks: a symlink planted at the destination, at
// the old predictable temporary name, or where a directory goes never makes
// an export write through it.
func TestExportNeverFollowsSymlinks(t *testing.T) {
	src := t.TempDir()
	want := writeTree(t, src, map[string]int{"f": 5000, "d/g": 300}, 9)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	precious := []byte("do not overwrite\n")
	reset := func() {
		if err := os.WriteFile(victim, precious, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	intact := func(what string) {
		t.Helper()
		if b, err := os.ReadFile(victim); err != nil || !bytes.Equal(b, precious) {
			t.Fatalf("%s: the symlink's target was written: %q %v", what, b, err)
		}
	}

	// At the destination, with --force: the symlink is replaced, its
	// target untouched.
	reset()
	out := t.TempDir()
	dest := filepath.Join(out, "f")
	os.Symlink(victim, dest)
	if _, _, err := s.Export(ctx, "m/f", dest, ExportOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	intact("symlink at destination")
	if st, err := os.Lstat(dest); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("destination is not a regular file: %v %v", st, err)
	}
	if b, _ := os.ReadFile(dest); !bytes.Equal(b, want["f"]) {
		t.Fatal("exported bytes differ")
	}

	// Without --force: refused.
	reset()
	dest2 := filepath.Join(out, "f2")
	os.Symlink(victim, dest2)
	if _, _, err := s.Export(ctx, "m/f", dest2, ExportOptions{}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("export onto a symlink without --force: %v", err)
	}
	intact("symlink at destination, no --force")

	// At the temporary name the old code used.
	reset()
	dest3 := filepath.Join(out, "f3")
	os.Symlink(victim, dest3+".kylix-partial")
	if _, _, err := s.Export(ctx, "m/f", dest3, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	intact("symlink at the old temporary name")

	// Where a directory goes.
	victimDir := t.TempDir()
	dest4 := filepath.Join(out, "tree")
	os.Symlink(victimDir, dest4)
	if _, _, err := s.Export(ctx, "m", dest4, ExportOptions{Overwrite: true}); err == nil {
		t.Fatal("export through a symlinked directory succeeded")
	}
	if ents, _ := os.ReadDir(victimDir); len(ents) != 0 {
		t.Fatalf("export wrote into the symlink's target directory: %v", ents)
	}
	// Nothing left behind under temporary names.
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".kylix-") && e.Name() != "f3.kylix-partial" {
			t.Fatalf("temporary file left behind: %s", e.Name())
		}
	}
}
