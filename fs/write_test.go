package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// storeBytes reads a namespace path straight from the store.
func storeBytes(t *testing.T, s *chunkstore.Store, path string) []byte {
	t.Helper()
	f, _, err := s.OpenPath(path)
	if err != nil {
		t.Fatalf("store: %s: %v", path, err)
	}
	b := make([]byte, f.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b
}

func TestWriteCommits(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	dir := filepath.Join(m.Dir, "ckpt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	big := pattern(21, 5<<20+3)
	p := filepath.Join(dir, "model.bin")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(big); off += 100000 {
		if _, err := f.Write(big[off:min(len(big), off+100000)]); err != nil {
			t.Fatal(err)
		}
	}
	// While the writer is open, a reader on this node sees its bytes.
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read while writing: %d bytes, %v", len(got), err)
	}
	if st, err := os.Stat(p); err != nil || st.Size() != int64(len(big)) {
		t.Fatalf("stat while writing: %v %v", st, err)
	}
	if _, err := m.Store.Lookup("ckpt/model.bin"); err == nil {
		t.Errorf("store has the file before close")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := storeBytes(t, m.Store, "ckpt/model.bin"); !bytes.Equal(got, big) {
		t.Fatalf("store bytes differ after commit")
	}
	// The committed large file is now served by passthrough.
	if got := getxattr(t, p, "user.kylix.path"); got != "passthrough" {
		t.Errorf("path after commit: %s", got)
	}
	// Random writes into the committed file (copy-up), then truncate.
	f, err = os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte{}, big...)
	for i, off := range []int{0, 4095, 1 << 20, len(big) - 10, len(big) + 5000} {
		data := []byte(fmt.Sprintf("<write %d>", i))
		if _, err := f.WriteAt(data, int64(off)); err != nil {
			t.Fatal(err)
		}
		if end := off + len(data); end > len(want) {
			want = append(want, make([]byte, end-len(want))...)
		}
		copy(want[off:], data)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := storeBytes(t, m.Store, "ckpt/model.bin"); !bytes.Equal(got, want) {
		t.Fatalf("store bytes differ after fsync")
	}
	if err := f.Truncate(4097); err != nil {
		t.Fatal(err)
	}
	want = want[:4097]
	f.Close()
	m.FS.Sync()
	if got := storeBytes(t, m.Store, "ckpt/model.bin"); !bytes.Equal(got, want) {
		t.Fatalf("store bytes differ after truncate")
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
		t.Fatalf("mount bytes differ after truncate")
	}
	// chmod and utimens reach the store.
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	m.FS.Sync()
	if e, err := m.Store.Lookup("ckpt/model.bin"); err != nil || e.Mode.Perm() != 0o600 {
		t.Errorf("mode in store: %v %v", e.Mode, err)
	}
}

func TestWritePassthroughBusy(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "a", map[string][]byte{"big": pattern(3, 2<<20)})
	p := filepath.Join(m.Dir, "a", "big")
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.OpenFile(p, os.O_WRONLY, 0); !errors.Is(err, syscall.ETXTBSY) {
		t.Errorf("write open while a passthrough reader is open: %v, want ETXTBSY", err)
	}
	r.Close()
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("write open after the reader closed: %v", err)
	}
	w.Close()
}

func TestManySmallFilesBatch(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	const n = 300
	for i := range n {
		p := filepath.Join(m.Dir, fmt.Sprintf("f%03d", i))
		if err := os.WriteFile(p, pattern(uint64(i), 4096+i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(m.Dir)
	if err != nil || len(ents) != n {
		t.Fatalf("readdir: %d entries, %v", len(ents), err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if got := storeBytes(t, m.Store, fmt.Sprintf("f%03d", i)); !bytes.Equal(got, pattern(uint64(i), 4096+i)) {
			t.Fatalf("f%03d differs", i)
		}
	}
	st := m.FS.Stats()
	t.Logf("%d files in %d commit batches", st.Commits, st.CommitBatches)
	if st.Commits != n {
		t.Errorf("commits = %d, want %d", st.Commits, n)
	}
}

func TestPendingRenameUnlink(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "d", map[string][]byte{"old": []byte("old content")})
	tmp := filepath.Join(m.Dir, "d", "x.tmp")
	if err := os.WriteFile(tmp, []byte("new content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.Dir, "d", "old")); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(m.Dir, "d", "gone")
	if err := os.WriteFile(gone, []byte("bye"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	m.FS.Sync()
	if got := storeBytes(t, m.Store, "d/old"); string(got) != "new content" {
		t.Errorf("d/old = %q", got)
	}
	for _, p := range []string{"d/x.tmp", "d/gone"} {
		if _, err := m.Store.Lookup(p); !errors.Is(err, chunkstore.ErrNotFound) {
			t.Errorf("%s in store: %v", p, err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(m.Dir, "d"))
	if len(ents) != 1 || ents[0].Name() != "old" {
		t.Errorf("d lists %v", ents)
	}
}

// TestSharedWritableMmap: stores through a MAP_SHARED mapping reach the
// committed version.
func TestSharedWritableMmap(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	p := filepath.Join(m.Dir, "mm.bin")
	want := pattern(31, 3*4096+100)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	copy(mm[5000:], "written through the mapping")
	copy(want[5000:], "written through the mapping")
	if err := unix.Msync(mm, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	unix.Munmap(mm)
	f.Close()
	m.FS.Sync()
	if got := storeBytes(t, m.Store, "mm.bin"); !bytes.Equal(got, want) {
		t.Fatalf("store bytes differ after writes through a mapping")
	}
}
