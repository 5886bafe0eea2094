package peers

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// memTree is an in-memory object store for merge tests.
type memTree map[chunkstore.ID]*chunkstore.DirManifest

func (m memTree) put(d *chunkstore.DirManifest) chunkstore.ID {
	id := chunkstore.Sum(d.Encode())
	m[id] = d
	return id
}

func (m memTree) get(id chunkstore.ID) (*chunkstore.DirManifest, error) {
	if id == emptyDirID {
		return &chunkstore.DirManifest{}, nil
	}
	d, ok := m[id]
	if !ok {
		return nil, fmt.Errorf("no dir %s", id.Short())
	}
	return d, nil
}

func (m memTree) merge(t *testing.T, a, b chunkstore.ID) chunkstore.ID {
	t.Helper()
	var objs [][]byte
	id, err := mergeTrees(a, b, m.get, nil, &objs)
	require.NoError(t, err)
	for _, o := range objs {
		d, err := chunkstore.DecodeDirManifest(o)
		require.NoError(t, err)
		m.put(d)
	}
	return id
}

func file(name string, content byte, hlc chunkstore.HLC) chunkstore.Entry {
	return chunkstore.Entry{Name: name, Kind: chunkstore.KindFile, Mode: 0o644, ID: chunkstore.ID{content}, Size: 1, HLC: hlc}
}

func dir(m memTree, name string, hlc chunkstore.HLC, es ...chunkstore.Entry) chunkstore.Entry {
	d := &chunkstore.DirManifest{}
	for _, e := range es {
		d.Put(e)
	}
	return chunkstore.Entry{Name: name, Kind: chunkstore.KindDir, Mode: 0o755, ID: m.put(d), HLC: hlc}
}

func root(m memTree, es ...chunkstore.Entry) chunkstore.ID {
	d := &chunkstore.DirManifest{}
	for _, e := range es {
		d.Put(e)
	}
	return m.put(d)
}

// TestMergeRule: different files on different members are all kept, two
// writes of one path keep the newest and the other as a conflict version,
// a removal newer than a write wins, and the merge is the same either way
// round and changes nothing the second time.
func TestMergeRule(t *testing.T) {
	m := memTree{}
	a := root(m, dir(m, "models", 10, file("x", 1, 10), file("same", 7, 5)), file("p", 2, 20), file("gone", 3, 5))
	tomb := chunkstore.Entry{Name: "gone", Kind: chunkstore.KindFile, Deleted: true, ID: emptyDirID, HLC: 30}
	b := root(m, dir(m, "models", 11, file("y", 4, 11), file("same", 7, 8)), file("p", 5, 25), tomb)

	ab, ba := m.merge(t, a, b), m.merge(t, b, a)
	require.Equal(t, ab, ba, "merge depends on the order")
	require.Equal(t, ab, m.merge(t, ab, a), "merging again changed the tree")
	require.Equal(t, ab, m.merge(t, b, ab), "merging again changed the tree")

	r, _ := m.get(ab)
	names := func(d *chunkstore.DirManifest) (out []string) {
		for _, e := range d.Live() {
			out = append(out, e.Name)
		}
		return
	}
	require.Equal(t, []string{"models", "p", fmt.Sprintf("p.conflict-%x", 20)}, names(r))
	i, _ := r.Find("p")
	require.Equal(t, byte(5), r.Entries[i].ID[0], "the newer write wins")
	i, _ = r.Find(fmt.Sprintf("p.conflict-%x", 20))
	require.Equal(t, byte(2), r.Entries[i].ID[0], "the older write is kept as a conflict version")
	i, ok := r.Find("gone")
	require.True(t, ok && r.Entries[i].Deleted, "a newer removal wins")
	i, _ = r.Find("models")
	sub, _ := m.get(r.Entries[i].ID)
	require.Equal(t, []string{"same", "x", "y"}, names(sub), "same content twice is no conflict")
}

// TestMergeMetadataTie: two entries of one name with the same HLC and the
// same content that differ only in mode, owner or mtime (a chmod, chown or
// touch on two members in one HLC tick) merge to the same tree whichever
// side is local. Before, the last tie-break compared names and targets
// only, so each side kept its own entry and the members never converged.
func TestMergeMetadataTie(t *testing.T) {
	for _, change := range []func(*chunkstore.Entry){
		func(e *chunkstore.Entry) { e.Mode = 0o600 },
		func(e *chunkstore.Entry) { e.UID = 1000 },
		func(e *chunkstore.Entry) { e.GID = 1000 },
		func(e *chunkstore.Entry) { e.MTime = 12345 },
	} {
		m := memTree{}
		fa, fb := file("f", 9, 40), file("f", 9, 40)
		change(&fb)
		a, b := root(m, fa), root(m, fb)
		ab, ba := m.merge(t, a, b), m.merge(t, b, a)
		require.Equal(t, ab, ba, "merge of %+v and %+v depends on the order", fa, fb)
		require.Equal(t, ab, m.merge(t, ab, a))
		require.Equal(t, ab, m.merge(t, ab, b))
		r, _ := m.get(ab)
		require.Len(t, r.Live(), 1, "same content: no conflict version")
	}
}

// TestOwnersZones: owners are the first members in rendezvous order on
// distinct zones; with fewer zones than replicas the rest come in order.
func TestOwnersZones(t *testing.T) {
	ms := []peer{{name: "a1", zone: "a", capacity: 1}, {name: "a2", zone: "a", capacity: 1}, {name: "a3", zone: "a", capacity: 1},
		{name: "b1", zone: "b", capacity: 1}, {name: "nz", capacity: 1}}
	for i := range 200 {
		id := chunkstore.Sum([]byte(fmt.Sprint(i)))
		own := owners(id, ms, 3)
		require.Len(t, own, 3)
		zones := map[string]bool{}
		for _, p := range own {
			zones[p.zone] = true
		}
		require.Len(t, zones, 3, "owners %v do not span the zones a, b and none", own)
		own = owners(id, ms[:3], 2)
		require.Equal(t, rank(id, ms[:3])[:2], own, "one zone: rendezvous order")
	}
}

// TestMergeSpecialFiles: fifos, sockets and device nodes merge per name
// like files: the same node on both sides is one entry; a device renumbered
// on one member, or a name made a fifo on one and a socket on another,
// keeps the newer and the other beside it as a conflict version; the
// merge is the same either way round and the result decodes.
func TestMergeSpecialFiles(t *testing.T) {
	m := memTree{}
	fifo := chunkstore.Entry{Name: "p", Kind: chunkstore.KindFifo, Mode: 0o644, HLC: 5}
	dev := func(rdev uint64, hlc chunkstore.HLC) chunkstore.Entry {
		return chunkstore.Entry{Name: "d", Kind: chunkstore.KindCharDev, Mode: 0o600, Rdev: rdev, HLC: hlc}
	}
	sock := chunkstore.Entry{Name: "s", Kind: chunkstore.KindSocket, Mode: 0o755, HLC: 9}
	asFifo := sock
	asFifo.Kind, asFifo.HLC = chunkstore.KindFifo, 8
	a := root(m, fifo, dev(0x103, 6), sock)
	b := root(m, fifo, dev(0x105, 7), asFifo)
	ab, ba := m.merge(t, a, b), m.merge(t, b, a)
	require.Equal(t, ab, ba, "merge depends on the order")
	require.Equal(t, ab, m.merge(t, ab, a))
	r, _ := m.get(ab)
	var got []string
	for _, e := range r.Live() {
		got = append(got, fmt.Sprintf("%s %v %#x", e.Name, e.Kind, e.Rdev))
	}
	require.Equal(t, []string{"d char-device 0x105", "d.conflict-6 char-device 0x103", "p fifo 0x0", "s socket 0x0", "s.conflict-8 fifo 0x0"}, got)
}

// TestMergeLinkSets: a link set changed on two members at once is never
// split. Member B wrote new content to the set and gave it a third name;
// member A (here) wrote other content to it, earlier, and unlinked one
// name. After the merge every name of the set shows B's content (the
// newer), the set's link count is its names (a removal newer than the
// name wins, as for any name), and A's content is kept beside the set's
// first name as NAME.conflict-HLC, an ordinary file, as a conflict of an
// ordinary file is kept.
func TestMergeLinkSets(t *testing.T) {
	s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()
	fileA, fileB, base := chunkstore.ID{2}, chunkstore.ID{3}, chunkstore.ID{1}
	require.NoError(t, s.Update(func(tx *chunkstore.NSTx) error {
		return tx.Put("f", chunkstore.Entry{Kind: chunkstore.KindFile, Mode: 0o644, ID: base, Size: 1})
	}))
	require.NoError(t, s.Update(func(tx *chunkstore.NSTx) error { return tx.Link("f", "g") }))
	r0, _, err := s.Root()
	require.NoError(t, err)
	f0, err := s.Lookup("f")
	require.NoError(t, err)

	// B's tree, made from the common one with newer HLCs.
	later := s.Clock().Now() + 1<<40
	rootM, err := s.DirManifest(r0)
	require.NoError(t, err)
	te, ok := chunkstore.TableEntry(rootM)
	require.True(t, ok)
	tabM, err := s.DirManifest(te.ID)
	require.NoError(t, err)
	tabB := &chunkstore.DirManifest{Entries: append([]chunkstore.Entry(nil), tabM.Entries...)}
	tabB.Entries[0].ID, tabB.Entries[0].Nlink, tabB.Entries[0].HLC = fileB, 3, later
	rootB := &chunkstore.DirManifest{Entries: append([]chunkstore.Entry(nil), rootM.Entries...)}
	rootB.Put(chunkstore.Entry{Name: "h", Kind: chunkstore.KindHardlink, Link: f0.Link, HLC: later})
	i, _ := rootB.Find(chunkstore.LinkTable)
	rootB.Entries[i].ID, rootB.Entries[i].HLC = chunkstore.Sum(tabB.Encode()), later
	fetched := map[chunkstore.ID][]byte{chunkstore.Sum(tabB.Encode()): tabB.Encode(), chunkstore.Sum(rootB.Encode()): rootB.Encode()}
	remote := chunkstore.Sum(rootB.Encode())

	// A's own changes meanwhile.
	require.NoError(t, s.Update(func(tx *chunkstore.NSTx) error { return tx.Remove("g", false) }))
	var hlcA chunkstore.HLC
	require.NoError(t, s.Update(func(tx *chunkstore.NSTx) error {
		hlcA = tx.HLC()
		return tx.PutLinked(f0.Link, chunkstore.Entry{Kind: chunkstore.KindFile, Mode: 0o644, ID: fileA, Size: 1})
	}))

	get := func(id chunkstore.ID) (*chunkstore.DirManifest, error) {
		if id == emptyDirID {
			return &chunkstore.DirManifest{}, nil
		}
		if b, ok := fetched[id]; ok {
			return chunkstore.DecodeDirManifest(b)
		}
		return s.DirManifest(id)
	}
	require.NoError(t, s.MergeNamespace(func(local chunkstore.ID) (chunkstore.ID, [][]byte, error) {
		var objs [][]byte
		id, err := mergeTrees(local, remote, get, nil, &objs)
		for _, b := range fetched {
			objs = append(objs, b)
		}
		return id, objs, err
	}))

	for _, n := range []string{"f", "h"} {
		e, err := s.Lookup(n)
		require.NoError(t, err, n)
		require.Equal(t, fileB, e.ID, "%s: the newer content, through every name", n)
		require.Equal(t, f0.Link, e.Link, n)
		require.Equal(t, uint32(2), e.Nlink, "%s: the set's names are f and h", n)
	}
	_, err = s.Lookup("g")
	require.ErrorIs(t, err, chunkstore.ErrNotFound, "the newer removal of g wins")
	c, err := s.Lookup(fmt.Sprintf("f.conflict-%x", uint64(hlcA)))
	require.NoError(t, err, "A's content is kept as a conflict version")
	require.Equal(t, fileA, c.ID)
	require.Zero(t, c.Link, "the conflict version is an ordinary file, not a name of the set")
	l, err := s.List("")
	require.NoError(t, err)
	require.Len(t, l, 3, "f, h and the conflict version: %+v", l)
}

// TestMergeSameBytes: two manifests of one file that sameBytes calls the
// same content (a file made cold: same chunks, stripes named) merge to
// the newer with no conflict version, either way round; different
// content still keeps one.
func TestMergeSameBytes(t *testing.T) {
	m := memTree{}
	same := func(a, b chunkstore.ID) bool { return a[0]%10 == b[0]%10 } // 1 and 11: one content
	merge := func(a, b chunkstore.ID) *chunkstore.DirManifest {
		var objs [][]byte
		id, err := mergeTrees(a, b, m.get, same, &objs)
		require.NoError(t, err)
		for _, o := range objs {
			d, err := chunkstore.DecodeDirManifest(o)
			require.NoError(t, err)
			m.put(d)
		}
		d, err := m.get(id)
		require.NoError(t, err)
		return d
	}
	warm := root(m, file("f", 1, 10))
	cold := root(m, file("f", 11, 20))
	for _, d := range []*chunkstore.DirManifest{merge(warm, cold), merge(cold, warm)} {
		require.Len(t, d.Live(), 1, "a conversion is no conflict")
		require.Equal(t, chunkstore.ID{11}, d.Live()[0].ID, "the newer manifest wins")
	}
	other := root(m, file("f", 2, 20))
	require.Len(t, merge(warm, other).Live(), 2, "different content keeps a conflict version")
}
