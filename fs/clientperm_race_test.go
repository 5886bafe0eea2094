package fs_test

// Issue 18, item 5: the shared-pack rule (docs/design/client.md: a
// caller may read every live file with bytes in the pack) holds exactly
// while the pack-reader map is kept level with the namespace
// incrementally and PackReadableBy waits only for queued permission
// changes, not for every content commit.

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

func packsOfPath(t *testing.T, s *chunkstore.Store, p string) []uint64 {
	t.Helper()
	e, err := s.Lookup(p)
	if err != nil {
		t.Fatal(err)
	}
	sf, err := s.OpenFile(e.ID)
	if err != nil {
		t.Fatal(err)
	}
	return kfs.PackTable(sf)
}

// TestPackReadableRacesPermChanges: under a write load through the mount
// (new files committed all the time), each chmod 0600 of a file in a
// shared pack, chmod 0700 of its directory, and rename of it into a 0700
// directory is seen by the first PackReadableBy after the syscall
// returned (uid 65534 refused), and its undoing too (allowed again); the
// map, kept by diffs, equals one built from nothing at the end, and was
// built from nothing once.
func TestPackReadableRacesPermChanges(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	for _, d := range []string{"pub", "priv", "w"} {
		if err := os.Mkdir(filepath.Join(m.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(m.Dir, "priv"), 0o700)
	for _, name := range []string{"a", "s"} {
		if err := os.WriteFile(filepath.Join(m.Dir, "pub", name), []byte("bytes of "+name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	pa, ps := packsOfPath(t, m.Store, "pub/a"), packsOfPath(t, m.Store, "pub/s")
	if len(pa) != 1 || len(ps) != 1 || pa[0] != ps[0] {
		t.Fatalf("pub/a in packs %v, pub/s in %v: want one shared pack", pa, ps)
	}
	pack := pa[0]
	nobody := kfs.Cred{UID: 65534, GID: 65534}
	readable := func() bool {
		ok, err := m.FS.PackReadableBy(pack, nobody)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !readable() {
		t.Fatal("uid 65534 refused a pack of 0644 files")
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	defer halt() // before the unmount, also when a check fails
	var wrote atomic.Int64
	for g := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// some files small enough to land in the shared pack
				// pub/a is in (or the one after it), some not
				b := []byte(fmt.Sprintf("writer %d file %d %s", g, i, make([]byte, i%3*9000)))
				f, err := os.Create(filepath.Join(m.Dir, "w", fmt.Sprintf("%d-%d", g, i)))
				if err == nil {
					_, err = f.Write(b)
					if i%10 == 9 && err == nil {
						err = f.Sync() // waits for the commit: the load stays one the committer keeps up with
					}
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil {
					t.Errorf("write: %v", err)
					return
				}
				wrote.Add(1)
			}
		})
	}
	// Readers of the map besides the checks below.
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := m.FS.PackReadableBy(pack, nobody); err != nil {
					t.Errorf("PackReadableBy: %v", err)
					return
				}
			}
		})
	}
	s := filepath.Join(m.Dir, "pub", "s")
	steps := []struct {
		what     string
		do, undo func() error
	}{
		{"chmod 0600 of a file in the pack",
			func() error { return os.Chmod(s, 0o600) },
			func() error { return os.Chmod(s, 0o644) }},
		{"chmod 0700 of its directory",
			func() error { return os.Chmod(filepath.Join(m.Dir, "pub"), 0o700) },
			func() error { return os.Chmod(filepath.Join(m.Dir, "pub"), 0o755) }},
		{"rename into a 0700 directory",
			func() error { return os.Rename(s, filepath.Join(m.Dir, "priv", "s")) },
			func() error { return os.Rename(filepath.Join(m.Dir, "priv", "s"), s) }},
		{"chown to another user with mode 0640",
			func() error {
				if err := os.Chmod(s, 0o640); err != nil {
					return err
				}
				return os.Chown(s, 1234, 1234)
			},
			func() error {
				if err := os.Chown(s, 0, 0); err != nil {
					return err
				}
				return os.Chmod(s, 0o644)
			}},
	}
	rounds := 0
	for ; rounds < 5; rounds++ {
		for _, st := range steps {
			if err := st.do(); err != nil {
				t.Fatalf("%s: %v", st.what, err)
			}
			if readable() {
				t.Fatalf("round %d: after %s returned, uid 65534 may still read the pack", rounds, st.what)
			}
			if err := st.undo(); err != nil {
				t.Fatalf("undo %s: %v", st.what, err)
			}
			if !readable() {
				t.Fatalf("round %d: after undoing %s, uid 65534 is refused the pack", rounds, st.what)
			}
		}
	}
	halt()
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	// Unlink: a file removed leaves the map.
	if err := os.Chmod(s, 0o600); err != nil {
		t.Fatal(err)
	}
	if readable() {
		t.Fatal("0600 file in the pack: uid 65534 may read it")
	}
	if err := os.Remove(s); err != nil {
		t.Fatal(err)
	}
	if !readable() {
		t.Fatal("the 0600 file was removed: the pack's live files are all readable")
	}
	builds, diffs, diff, err := kfs.PackReadersCheck(m.FS)
	if err != nil {
		t.Fatal(err)
	}
	if diff != "" {
		t.Fatalf("the map kept by diffs differs from one built from nothing:\n%s", diff)
	}
	t.Logf("%d rounds, %d files written; map built %d times from nothing, updated %d times", rounds, wrote.Load(), builds, diffs)
	if builds != 1 || diffs == 0 || wrote.Load() == 0 {
		t.Fatalf("builds %d, diffs %d, files written %d: want 1 build and incremental updates under write load", builds, diffs, wrote.Load())
	}
}
