package chunkstore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// xorStripe makes a stripe of the chunks refs with one parity shard (their
// XOR: a valid record, though the codec's arithmetic is peers/stripe's)
// and stores the parity in s as a chunk of its own.
func xorStripe(t *testing.T, s *Store, refs []ChunkRef) (*Stripe, ID) {
	t.Helper()
	var size uint32
	for _, c := range refs {
		size = max(size, c.Len)
	}
	parity := make([]byte, size)
	for _, c := range refs {
		b, err := s.ReadChunk(context.Background(), c.ID)
		require.NoError(t, err)
		for i := range b {
			parity[i] ^= b[i]
		}
	}
	pid := Sum(parity)
	im := s.NewImporter()
	require.NoError(t, im.PutChunk(pid, parity))
	require.NoError(t, im.Close())
	return &Stripe{K: len(refs), M: 1, ShardSize: size, Chunks: refs, Parity: []ID{pid}}, pid
}

// TestCodedManifest: a file's stripes round-trip through its manifest, a
// file without stripes keeps its KXF1 id, and the decoder refuses a
// stripe naming none of the file's chunks, stripes out of order, and a
// damaged record.
func TestCodedManifest(t *testing.T) {
	a := ChunkRef{ID: Sum([]byte("a")), Len: 1}
	b := ChunkRef{ID: Sum([]byte("bb")), Len: 2}
	other := ChunkRef{ID: Sum([]byte("ccc")), Len: 3}
	plain := &FileManifest{Size: 3, Chunks: []ChunkRef{a, b}}
	r1 := &Stripe{K: 2, M: 1, ShardSize: 2, Chunks: []ChunkRef{a, b}, Parity: []ID{Sum([]byte("p1"))}}
	r2 := &Stripe{K: 2, M: 2, ShardSize: 3, Chunks: []ChunkRef{b, other}, Parity: []ID{Sum([]byte("p2")), Sum([]byte("p3"))}}
	coded := &FileManifest{Size: 3, Chunks: []ChunkRef{a, b}, Stripes: []*Stripe{r2, r1}}
	enc := coded.Encode()
	require.Equal(t, manifestFileCoded, string(enc[:4]))
	require.Equal(t, manifestFile, string(plain.Encode()[:4]))
	require.Equal(t, enc, (&FileManifest{Size: 3, Chunks: []ChunkRef{a, b}, Stripes: []*Stripe{r1, r2}}).Encode(), "one encoding whatever the order given")
	got, err := DecodeFileManifest(enc)
	require.NoError(t, err)
	require.Len(t, got.Stripes, 2)
	require.Equal(t, enc, got.Encode())
	require.NotNil(t, got.Coded(a.ID))
	require.Nil(t, got.Coded(Sum([]byte("nope"))))

	stranger := &Stripe{K: 1, M: 1, ShardSize: 3, Chunks: []ChunkRef{other}, Parity: []ID{Sum([]byte("p4"))}}
	bad := (&FileManifest{Size: 3, Chunks: []ChunkRef{a, b}, Stripes: []*Stripe{stranger}}).Encode()
	_, err = DecodeFileManifest(bad)
	require.ErrorIs(t, err, ErrCorrupt, "a stripe naming none of the file's chunks")

	// Two stripes swapped after encoding: out of order.
	e1, _ := r1.MarshalBinary()
	e2, _ := r2.MarshalBinary()
	body := plain.Encode()
	swapped := append([]byte(manifestFileCoded), body[4:]...)
	first, second := e1, e2
	if string(e1) < string(e2) {
		first, second = e2, e1
	}
	swapped = append(swapped, 2, byte(len(first)))
	swapped = append(swapped, first...)
	swapped = append(swapped, byte(len(second)))
	swapped = append(swapped, second...)
	_, err = DecodeFileManifest(swapped)
	require.ErrorIs(t, err, ErrCorrupt, "stripes out of order")

	// A flipped k in the first record.
	damaged := append([]byte(nil), enc...)
	damaged[len(body)+2+4] = MaxStripeData + 1
	_, err = DecodeFileManifest(damaged)
	require.ErrorIs(t, err, ErrCorrupt)
	for n := range len(enc) {
		_, err := DecodeFileManifest(enc[:n])
		require.Error(t, err, "cut at %d", n)
	}
}

// TestSetFileStripes: a file made cold keeps its bytes and metadata, GC
// keeps its parity and the data shards of its stripes that are chunks of
// a removed file, a conversion of a file written meanwhile changes nothing
// (ErrFileChanged), and making it warm again lets GC take the parity.
func TestSetFileStripes(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir())
	src := t.TempDir()
	want := writeTree(t, src, map[string]int{"cold": 3 << 20, "gone": 12 << 20}, 21)
	_, err := s.Import(ctx, src, "d", ImportOptions{})
	require.NoError(t, err)
	cold, err := s.Lookup("d/cold")
	require.NoError(t, err)
	m, err := s.FileManifest(cold.ID)
	require.NoError(t, err)
	gone, err := s.Lookup("d/gone")
	require.NoError(t, err)
	gm, err := s.FileManifest(gone.ID)
	require.NoError(t, err)
	require.Greater(t, len(gm.Chunks), 1)
	// One stripe holds the first chunk of each file.
	r, pid := xorStripe(t, s, []ChunkRef{m.Chunks[0], gm.Chunks[0]})

	_, err = s.SetFileStripes("d/cold", Sum([]byte("not it")), []*Stripe{r})
	require.ErrorIs(t, err, ErrFileChanged)
	_, err = s.SetFileStripes("d/gone", gone.ID, []*Stripe{{K: 1, M: 1, ShardSize: 1, Chunks: []ChunkRef{{ID: Sum([]byte("x")), Len: 1}}, Parity: []ID{pid}}})
	require.ErrorIs(t, err, ErrBadStripe, "a stripe naming none of the file's chunks")

	id, err := s.SetFileStripes("d/cold", cold.ID, []*Stripe{r})
	require.NoError(t, err)
	e, err := s.Lookup("d/cold")
	require.NoError(t, err)
	require.Equal(t, id, e.ID)
	require.Equal(t, cold.MTime, e.MTime)
	require.Equal(t, cold.Mode, e.Mode)
	require.Greater(t, e.HLC, cold.HLC, "a newer entry, which a merge spreads")
	cm, err := s.FileManifest(id)
	require.NoError(t, err)
	require.Equal(t, m.Chunks, cm.Chunks)
	require.Len(t, cm.Stripes, 1)

	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("d/gone", false) }))
	_, err = s.GC(ctx)
	require.NoError(t, err)
	require.True(t, s.HasChunk(pid), "the parity of a cold file's stripe is live")
	require.True(t, s.HasChunk(gm.Chunks[0].ID), "a removed file's chunk in a live stripe is a data shard of it")
	require.False(t, s.HasChunk(gm.Chunks[len(gm.Chunks)-1].ID), "the removed file's other chunks are garbage")
	f, _, err := s.OpenPath("d/cold")
	require.NoError(t, err)
	got := make([]byte, len(want["cold"]))
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, want["cold"], got)

	// Warm again: the stripe is named by nothing.
	_, err = s.SetFileStripes("d/cold", id, nil)
	require.NoError(t, err)
	e, err = s.Lookup("d/cold")
	require.NoError(t, err)
	require.Equal(t, cold.ID, e.ID, "a warm file has its KXF1 manifest again")
	_, err = s.GC(ctx)
	require.NoError(t, err)
	require.False(t, s.HasChunk(pid))
	require.False(t, s.HasChunk(gm.Chunks[0].ID))
}

// TestSetFileStripesHardLink: a file with two names made cold through one
// name is cold through both (the link set's entry changes), and keeps its
// link count.
func TestSetFileStripesHardLink(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir())
	src := t.TempDir()
	writeTree(t, src, map[string]int{"f": 3 << 20}, 22)
	_, err := s.Import(ctx, src, "d", ImportOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Link("d/f", "d/g") }))
	e, err := s.Lookup("d/f")
	require.NoError(t, err)
	require.NotZero(t, e.Link)
	m, err := s.FileManifest(e.ID)
	require.NoError(t, err)
	r, _ := xorStripe(t, s, m.Chunks[:1])
	id, err := s.SetFileStripes("d/f", e.ID, []*Stripe{r})
	require.NoError(t, err)
	for _, name := range []string{"d/f", "d/g"} {
		got, err := s.Lookup(name)
		require.NoError(t, err)
		require.Equal(t, id, got.ID, name)
		require.Equal(t, e.Link, got.Link, name)
		require.Equal(t, uint32(2), got.Nlink, name)
	}
}
