package stripe

import (
	"encoding/binary"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
)

// Limits of a stripe. reedsolomon allows up to 256 shards in all; a stripe
// is kept far below so that a record stays small (at most 64 members: 2.4
// KiB) and a decoder's allocations are bounded before it reads a member.
const (
	MaxData   = 32 // k
	MaxParity = 16 // m
)

// recordMagic starts every encoded record; a future format gets a new one.
const recordMagic = "KXS1"

// Member is one data chunk of a stripe.
type Member struct {
	ID  chunkstore.ID
	Len uint32
}

// Record describes one stripe: its member chunks (data shards 0..n-1, in
// this order), k and m, the shard size (the longest member's length: the
// others are zero-padded to it while coded) and the BLAKE3 of each of the m
// parity shards. A stripe of fewer than k members codes the missing data
// shards as zeros, which are never stored: they count as known shards when
// rebuilding. A data shard's check is its chunk id.
type Record struct {
	K, M      int
	ShardSize uint32
	Chunks    []Member
	Parity    []chunkstore.ID
}

// Shards is k+m, the shards of the code (stored ones and known zeros).
func (r *Record) Shards() int { return r.K + r.M }

// Stored is how many shards are stored on members: the chunks and the
// parity.
func (r *Record) Stored() int { return len(r.Chunks) + r.M }

// ShardID returns the id shard i is stored and checked under: chunk i's id
// for a data shard, the parity's for i >= k. Known zero shards (n <= i < k)
// have none (ok false).
func (r *Record) ShardID(i int) (id chunkstore.ID, size uint32, ok bool) {
	switch {
	case i >= 0 && i < len(r.Chunks):
		return r.Chunks[i].ID, r.Chunks[i].Len, true
	case i >= r.K && i < r.K+r.M:
		return r.Parity[i-r.K], r.ShardSize, true
	}
	return chunkstore.ID{}, 0, false
}

// Logical is the bytes of the member chunks; Raw the bytes stored for the
// stripe (members and parity). Raw/Logical is its overhead.
func (r *Record) Logical() int64 {
	var n int64
	for _, c := range r.Chunks {
		n += int64(c.Len)
	}
	return n
}

// Raw is Logical plus the parity shards.
func (r *Record) Raw() int64 { return r.Logical() + int64(r.M)*int64(r.ShardSize) }

// Overhead is Raw/Logical: (k+m)/k for a full stripe of equal chunks, more
// with fewer members or unequal lengths.
func (r *Record) Overhead() float64 { return float64(r.Raw()) / float64(r.Logical()) }

// check reports whether r is a stripe this package makes and reads.
func (r *Record) check() error {
	switch {
	case r.K < 1 || r.K > MaxData:
		return fmt.Errorf("k = %d, want 1 to %d: %w", r.K, MaxData, ErrBadRecord)
	case r.M < 1 || r.M > MaxParity:
		return fmt.Errorf("m = %d, want 1 to %d: %w", r.M, MaxParity, ErrBadRecord)
	case len(r.Chunks) < 1 || len(r.Chunks) > r.K:
		return fmt.Errorf("%d chunks in a stripe of k = %d: %w", len(r.Chunks), r.K, ErrBadRecord)
	case len(r.Parity) != r.M:
		return fmt.Errorf("%d parity ids for m = %d: %w", len(r.Parity), r.M, ErrBadRecord)
	case r.ShardSize < 1 || r.ShardSize > chunkstore.MaxChunkLen:
		return fmt.Errorf("shard size %d: %w", r.ShardSize, ErrBadRecord)
	}
	var longest uint32
	for _, c := range r.Chunks {
		if c.Len < 1 || c.Len > r.ShardSize {
			return fmt.Errorf("chunk %s of %d bytes in shards of %d: %w", c.ID.Short(), c.Len, r.ShardSize, ErrBadRecord)
		}
		longest = max(longest, c.Len)
	}
	if longest != r.ShardSize {
		// One encoding per stripe: the shard size is the longest chunk.
		return fmt.Errorf("shard size %d, longest chunk %d: %w", r.ShardSize, longest, ErrBadRecord)
	}
	return nil
}

// MarshalBinary returns r's canonical encoding (big-endian):
//
//	"KXS1"  k (1 byte)  m (1 byte)  n (1 byte)  shard size (4 bytes)
//	n x { chunk id (32 bytes)  length (4 bytes) }
//	m x { parity id (32 bytes) }
//
// Every stripe has exactly one encoding; ID is its BLAKE3.
func (r *Record) MarshalBinary() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 11+36*len(r.Chunks)+32*r.M)
	b = append(b, recordMagic...)
	b = append(b, byte(r.K), byte(r.M), byte(len(r.Chunks)))
	b = binary.BigEndian.AppendUint32(b, r.ShardSize)
	for _, c := range r.Chunks {
		b = append(b, c.ID[:]...)
		b = binary.BigEndian.AppendUint32(b, c.Len)
	}
	for _, p := range r.Parity {
		b = append(b, p[:]...)
	}
	return b, nil
}

// ID is the stripe's id: the BLAKE3 of its encoding. Placement ranks
// members for a stripe by it.
func (r *Record) ID() (chunkstore.ID, error) {
	b, err := r.MarshalBinary()
	if err != nil {
		return chunkstore.ID{}, err
	}
	return chunkstore.Sum(b), nil
}

// ParseRecord decodes an encoded record, refusing anything but the
// canonical encoding of a valid stripe (ErrBadRecord). Sizes are checked
// before anything is allocated.
func ParseRecord(b []byte) (*Record, error) {
	const head = 11
	if len(b) < head || string(b[:4]) != recordMagic {
		return nil, fmt.Errorf("%d bytes without the magic %q: %w", len(b), recordMagic, ErrBadRecord)
	}
	r := &Record{K: int(b[4]), M: int(b[5]), ShardSize: binary.BigEndian.Uint32(b[7:11])}
	n := int(b[6])
	if n < 1 || n > MaxData || r.M < 1 || r.M > MaxParity {
		return nil, fmt.Errorf("%d chunks, m = %d: %w", n, r.M, ErrBadRecord)
	}
	if want := head + 36*n + 32*r.M; len(b) != want {
		return nil, fmt.Errorf("%d bytes, want %d for %d chunks and m = %d: %w", len(b), want, n, r.M, ErrBadRecord)
	}
	r.Chunks = make([]Member, n)
	o := head
	for i := range r.Chunks {
		copy(r.Chunks[i].ID[:], b[o:o+32])
		r.Chunks[i].Len = binary.BigEndian.Uint32(b[o+32 : o+36])
		o += 36
	}
	r.Parity = make([]chunkstore.ID, r.M)
	for i := range r.Parity {
		copy(r.Parity[i][:], b[o:o+32])
		o += 32
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return r, nil
}
