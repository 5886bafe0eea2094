package fs_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// TestStress runs writers, readers, renames, unlinks and imports behind
// the mount's back at once, then checks that the store verifies. Names in
// the "atomic" set are only ever replaced by rename of a fully written
// temporary file, so every read of them must see one whole version; the
// others are rewritten in place by concurrent writers (where, as on any
// file system, readers may see a write in progress).
func TestStress(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	dur := 2 * time.Second
	if testing.Short() {
		dur = 500 * time.Millisecond
	}
	// Every version of every file: one 9-byte pattern repeated, its number
	// (below 10^7) inside.
	content := func(n int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("<%07d>", n)), 1+n%3000)
	}
	atomic := []string{"a", "b", "d/e"}
	inPlace := []string{"c", "d/f"}
	os.Mkdir(filepath.Join(m.Dir, "d"), 0o755)
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for i := 0; time.Now().Before(deadline); i++ {
				p := filepath.Join(m.Dir, atomic[r.IntN(len(atomic))])
				switch r.IntN(6) {
				case 0, 1:
					os.WriteFile(filepath.Join(m.Dir, inPlace[r.IntN(len(inPlace))]), content(g*1000000+i), 0o644)
				case 2:
					if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
						var n int
						fmt.Sscanf(string(b), "<%07d>", &n)
						if !bytes.Equal(b, content(n)) {
							t.Errorf("%s: torn read (%d bytes)", p, len(b))
						}
					}
				case 3:
					os.Rename(p, filepath.Join(m.Dir, atomic[r.IntN(len(atomic))]))
				case 4:
					os.Remove(p)
				case 5:
					tmp := fmt.Sprintf("%s.tmp%d", p, g)
					if os.WriteFile(tmp, content(g*1000000+i), 0o644) == nil {
						os.Rename(tmp, p)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; time.Now().Before(deadline); i++ {
			importTree(t, m, "imp", map[string][]byte{"x": content(9000000 + i)})
			time.Sleep(50 * time.Millisecond)
		}
	}()
	wg.Wait()
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	rep, err := m.Store.Verify(context.Background(), "", nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	for _, name := range atomic {
		p := filepath.Join(m.Dir, name)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		var n int
		fmt.Sscanf(string(b), "<%07d>", &n)
		if !bytes.Equal(b, content(n)) {
			t.Errorf("%s: not a whole version (%d bytes)", p, len(b))
		}
		if sb := storeBytes(t, m.Store, name); !bytes.Equal(sb, b) {
			t.Errorf("%s: the store has %d bytes, the mount %d", name, len(sb), len(b))
		}
	}
	st := m.FS.Stats()
	t.Logf("%d commits in %d batches", st.Commits, st.CommitBatches)
}
