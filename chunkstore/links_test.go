package chunkstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func putTestFile(t *testing.T, s *Store, path, content string) Entry {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.WriteFile(src, []byte(content), 0o644))
	fh, err := os.Open(src)
	require.NoError(t, err)
	defer fh.Close()
	im := s.NewImporter()
	defer im.Abort()
	r, err := im.PutFile(context.Background(), fh, "f", nil)
	require.NoError(t, err)
	require.NoError(t, im.Close())
	e := Entry{Kind: KindFile, Mode: 0o644, UID: 1000, GID: 1000, ID: r.ID, Size: r.Size}
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Put(path, e) }))
	return e
}

// TestLinkTable: link makes a set of two names sharing one entry; a write
// through one name (PutLinked) is seen through both; unlink keeps the
// other; rename moves a name; the table is hidden from lookups and
// listings and its name reserved; the last unlink drops the set.
func TestLinkTable(t *testing.T) {
	s := openTest(t, t.TempDir())
	putTestFile(t, s, "a/f", "one")
	putTestFile(t, s, "top", "two") // in the root, before the table's name
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Link("top", "top2") }))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("top2", false) }))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("top", false) }))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Link("a/f", "b/g") }))
	f, err := s.Lookup("a/f")
	require.NoError(t, err)
	g, err := s.Lookup("b/g")
	require.NoError(t, err)
	require.NotZero(t, f.Link)
	require.Equal(t, f.Link, g.Link)
	require.Equal(t, uint32(2), f.Nlink)
	require.Equal(t, KindFile, g.Kind)
	require.Equal(t, f.ID, g.ID)
	require.Equal(t, "g", g.Name)

	_, err = s.Lookup(LinkTable)
	require.ErrorIs(t, err, ErrNotFound)
	l, err := s.List("")
	require.NoError(t, err)
	require.Len(t, l, 2, "the table is not listed: %+v", l)
	require.ErrorIs(t, s.Update(func(tx *NSTx) error { return tx.Put(LinkTable+"/x", f) }), ErrInvalidPath)

	// Metadata through the set: every name sees it.
	g.Mode = 0o600
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.PutLinked(g.Link, g) }))
	f, _ = s.Lookup("a/f")
	require.Equal(t, 0o600, int(f.Mode))

	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Rename("b/g", "c") }))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Link("c", "d") }))
	c, _ := s.Lookup("c")
	require.Equal(t, uint32(3), c.Nlink)
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("a/f", false) }))
	c, _ = s.Lookup("d")
	require.Equal(t, uint32(2), c.Nlink)
	var walked []string
	require.NoError(t, s.Walk("", func(p string, e Entry) error {
		walked = append(walked, p+":"+e.Kind.String())
		return nil
	}))
	require.Equal(t, []string{":dir", "a:dir", "b:dir", "c:file", "d:file"}, walked)
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("c", false) }))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("d", false) }))
	tab, err := s.linkTable()
	require.NoError(t, err)
	require.Empty(t, tab.Live(), "the last unlink drops the set")
	res, err := s.GC(context.Background())
	require.NoError(t, err)
	require.NotZero(t, res.ChunksRemoved, "the set's content is collected once no name has it")
}

// TestImportExportHardLinks: a tree whose files have several names (st_nlink
// > 1) imports as link sets, the content read once per set; export makes
// the names hard links again (one inode, the link count of the tree), and
// importing the export gives the same namespace. gc and compaction keep the
// sets' content: export after them still writes every byte.
func TestImportExportHardLinks(t *testing.T) {
	src := t.TempDir()
	j := filepath.Join
	require.NoError(t, os.MkdirAll(j(src, "a", "b"), 0o755))
	require.NoError(t, os.WriteFile(j(src, "f"), []byte("shared bytes"), 0o640))
	require.NoError(t, os.Link(j(src, "f"), j(src, "a", "g")))
	require.NoError(t, os.Link(j(src, "f"), j(src, "a", "b", "h")))
	require.NoError(t, os.WriteFile(j(src, "solo"), []byte("one name"), 0o644))
	require.NoError(t, os.WriteFile(j(src, "pair1"), []byte("two"), 0o600))
	require.NoError(t, os.Link(j(src, "pair1"), j(src, "pair2")))

	s := openTest(t, t.TempDir())
	ctx := context.Background()
	res, err := s.Import(ctx, src, "m", ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, res.Files, "each set's content is read once")
	require.Equal(t, 3, res.Hardlinks)
	f, err := s.Lookup("m/f")
	require.NoError(t, err)
	for _, n := range []string{"m/a/g", "m/a/b/h"} {
		e, err := s.Lookup(n)
		require.NoError(t, err)
		require.Equal(t, f.Link, e.Link, n)
		require.Equal(t, uint32(3), e.Nlink, n)
		require.Equal(t, f.ID, e.ID, n)
	}
	solo, _ := s.Lookup("m/solo")
	require.Zero(t, solo.Link)

	// Drop other content, then gc and compact: the sets' content stays.
	putTestFile(t, s, "junk", "to be collected")
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("junk", false) }))
	_, err = s.Collect(ctx, GCOptions{Compact: true, CompactThreshold: 0.01})
	require.NoError(t, err)

	dest := j(t.TempDir(), "out")
	_, _, err = s.Export(ctx, "m", dest, ExportOptions{})
	require.NoError(t, err)
	ino := func(p string) (uint64, uint64) {
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		return st.Ino, st.Nlink
	}
	i1, n1 := ino(j(dest, "f"))
	require.Equal(t, uint64(3), n1)
	for _, n := range []string{"a/g", "a/b/h"} {
		i, nl := ino(j(dest, n))
		require.Equal(t, i1, i, n)
		require.Equal(t, uint64(3), nl, n)
		b, err := os.ReadFile(j(dest, n))
		require.NoError(t, err)
		require.Equal(t, "shared bytes", string(b))
	}
	p1, _ := ino(j(dest, "pair1"))
	p2, _ := ino(j(dest, "pair2"))
	require.Equal(t, p1, p2)
	_, sn := ino(j(dest, "solo"))
	require.Equal(t, uint64(1), sn)

	// The export imported again is the same tree.
	res2, err := s.Import(ctx, dest, "m2", ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, res.Files, res2.Files)
	require.Equal(t, res.Hardlinks, res2.Hardlinks)
	// Replacing m (a directory holding link names) counts every set
	// again: m's sets go, m2's stay.
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("m", true) }))
	tab, err := s.linkTable()
	require.NoError(t, err)
	require.Len(t, tab.Live(), 2, "only m2's two sets are left")
	e, err := s.Lookup("m2/a/g")
	require.NoError(t, err)
	require.Equal(t, uint32(3), e.Nlink)
}
