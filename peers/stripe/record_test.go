package stripe

import (
	"encoding/binary"
	mrand "math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

func sampleRecord(t testing.TB, k, m int, lens []int) *Record {
	c, err := New(k, m)
	require.NoError(t, err)
	r, _, err := c.Encode(randChunks(mrand.New(mrand.NewPCG(9, 10)), lens), nil)
	require.NoError(t, err)
	return r
}

// TestRecordRoundTrip: encode, parse, the same record and the same id.
func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []*Record{
		sampleRecord(t, 6, 2, []int{100, 200, 300, 400, 500, 600}),
		sampleRecord(t, 10, 2, []int{5}),
		sampleRecord(t, 1, 1, []int{1}),
	} {
		b, err := r.MarshalBinary()
		require.NoError(t, err)
		require.Len(t, b, 11+36*len(r.Chunks)+32*r.M)
		got, err := ParseRecord(b)
		require.NoError(t, err)
		require.Equal(t, r, got)
		id1, err := r.ID()
		require.NoError(t, err)
		id2, err := got.ID()
		require.NoError(t, err)
		require.Equal(t, id1, id2)
		require.Equal(t, chunkstore.Sum(b), id1)
	}
}

// TestRecordRefuses: every way an encoding can be other than canonical.
func TestRecordRefuses(t *testing.T) {
	r := sampleRecord(t, 4, 2, []int{100, 300, 200})
	good, err := r.MarshalBinary()
	require.NoError(t, err)
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string][]byte{
		"empty":          nil,
		"magic":          edit(func(b []byte) []byte { b[0] = 'Y'; return b }),
		"k zero":         edit(func(b []byte) []byte { b[4] = 0; return b }),
		"k too big":      edit(func(b []byte) []byte { b[4] = MaxData + 1; return b }),
		"n above k":      edit(func(b []byte) []byte { b[4] = 2; return b }),
		"m zero":         edit(func(b []byte) []byte { b[5] = 0; return b }),
		"n zero":         edit(func(b []byte) []byte { b[6] = 0; return b }),
		"trailing byte":  edit(func(b []byte) []byte { return append(b, 0) }),
		"cut short":      edit(func(b []byte) []byte { return b[:len(b)-1] }),
		"shard too long": edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[7:], 301); return b }),
		"shard too short": edit(func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[7:], 299)
			return b
		}),
		"chunk length 0": edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[11+32:], 0); return b }),
	}
	for name, b := range cases {
		_, err := ParseRecord(b)
		require.ErrorIs(t, err, ErrBadRecord, name)
	}
	bad := *r
	bad.Parity = bad.Parity[:1]
	_, err = bad.MarshalBinary()
	require.ErrorIs(t, err, ErrBadRecord)
	_, err = bad.ID()
	require.ErrorIs(t, err, ErrBadRecord)
	_, err = NewShards(&bad)
	require.ErrorIs(t, err, ErrBadRecord)
}

// FuzzParseRecord: whatever ParseRecord accepts encodes back to the same
// bytes (one encoding per stripe), and nothing it is given makes it panic.
func FuzzParseRecord(f *testing.F) {
	for _, r := range []*Record{
		sampleRecord(f, 6, 2, []int{100, 200, 300, 400, 500, 600}),
		sampleRecord(f, 10, 2, []int{5, 5}),
		sampleRecord(f, 1, 1, []int{1}),
	} {
		b, err := r.MarshalBinary()
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte("KXS1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRecord(b)
		if err != nil {
			require.ErrorIs(t, err, ErrBadRecord)
			return
		}
		again, err := r.MarshalBinary()
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}
