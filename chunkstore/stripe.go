package chunkstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A stripe record: the metadata of coded (cold) data, docs/design/erasure.md.
// The coding arithmetic is peers/stripe's; the record lives here because a
// file manifest names the stripes of its chunks (FileManifest.Stripes) and
// garbage collection must reach every shard a stripe needs.

// ErrBadStripe: bytes that are not a canonical stripe record, or
// parameters no stripe may have (k, m, lengths out of range).
var ErrBadStripe = errors.New("not a valid stripe record")

// Limits of a stripe. reedsolomon allows up to 256 shards in all; a stripe
// is kept far below so that a record stays small (at most 64 members: 2.4
// KiB) and a decoder's allocations are bounded before it reads a member.
const (
	// maxStripeLen bounds an encoded record: the header, MaxStripeData
	// chunks and MaxStripeParity parity ids.
	maxStripeLen = 11 + 36*MaxStripeData + 32*MaxStripeParity

	MaxStripeData   = 32 // k
	MaxStripeParity = 16 // m
)

// stripeMagic starts every encoded record; a future format gets a new one.
const stripeMagic = "KXS1"

// Stripe describes one stripe: its member chunks (data shards 0..n-1, in
// this order), k and m, the shard size (the longest member's length: the
// others are zero-padded to it while coded) and the BLAKE3 of each of the m
// parity shards. A stripe of fewer than k members codes the missing data
// shards as zeros, which are never stored: they count as known shards when
// rebuilding. A data shard's check is its chunk id.
type Stripe struct {
	K, M      int
	ShardSize uint32
	Chunks    []ChunkRef
	Parity    []ID
}

// Shards is k+m, the shards of the code (stored ones and known zeros).
func (r *Stripe) Shards() int { return r.K + r.M }

// Stored is how many shards are stored on members: the chunks and the
// parity.
func (r *Stripe) Stored() int { return len(r.Chunks) + r.M }

// ShardID returns the id shard i is stored and checked under: chunk i's id
// for a data shard, the parity's for i >= k. Known zero shards (n <= i < k)
// have none (ok false).
func (r *Stripe) ShardID(i int) (id ID, size uint32, ok bool) {
	switch {
	case i >= 0 && i < len(r.Chunks):
		return r.Chunks[i].ID, r.Chunks[i].Len, true
	case i >= r.K && i < r.K+r.M:
		return r.Parity[i-r.K], r.ShardSize, true
	}
	return ID{}, 0, false
}

// Logical is the bytes of the member chunks; Raw the bytes stored for the
// stripe (members and parity). Raw/Logical is its overhead.
func (r *Stripe) Logical() int64 {
	var n int64
	for _, c := range r.Chunks {
		n += int64(c.Len)
	}
	return n
}

// Raw is Logical plus the parity shards.
func (r *Stripe) Raw() int64 { return r.Logical() + int64(r.M)*int64(r.ShardSize) }

// Overhead is Raw/Logical: (k+m)/k for a full stripe of equal chunks, more
// with fewer members or unequal lengths.
func (r *Stripe) Overhead() float64 { return float64(r.Raw()) / float64(r.Logical()) }

// Check reports whether r is a stripe Kylix makes and reads (ErrBadStripe
// when not).
func (r *Stripe) Check() error {
	switch {
	case r.K < 1 || r.K > MaxStripeData:
		return fmt.Errorf("k = %d, want 1 to %d: %w", r.K, MaxStripeData, ErrBadStripe)
	case r.M < 1 || r.M > MaxStripeParity:
		return fmt.Errorf("m = %d, want 1 to %d: %w", r.M, MaxStripeParity, ErrBadStripe)
	case len(r.Chunks) < 1 || len(r.Chunks) > r.K:
		return fmt.Errorf("%d chunks in a stripe of k = %d: %w", len(r.Chunks), r.K, ErrBadStripe)
	case len(r.Parity) != r.M:
		return fmt.Errorf("%d parity ids for m = %d: %w", len(r.Parity), r.M, ErrBadStripe)
	case r.ShardSize < 1 || r.ShardSize > MaxChunkLen:
		return fmt.Errorf("shard size %d: %w", r.ShardSize, ErrBadStripe)
	}
	var longest uint32
	for _, c := range r.Chunks {
		if c.Len < 1 || c.Len > r.ShardSize {
			return fmt.Errorf("chunk %s of %d bytes in shards of %d: %w", c.ID.Short(), c.Len, r.ShardSize, ErrBadStripe)
		}
		longest = max(longest, c.Len)
	}
	if longest != r.ShardSize {
		// One encoding per stripe: the shard size is the longest chunk.
		return fmt.Errorf("shard size %d, longest chunk %d: %w", r.ShardSize, longest, ErrBadStripe)
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
func (r *Stripe) MarshalBinary() ([]byte, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 11+36*len(r.Chunks)+32*r.M)
	b = append(b, stripeMagic...)
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
func (r *Stripe) ID() (ID, error) {
	b, err := r.MarshalBinary()
	if err != nil {
		return ID{}, err
	}
	return Sum(b), nil
}

// ParseRecord decodes an encoded record, refusing anything but the
// canonical encoding of a valid stripe (ErrBadStripe). Sizes are checked
// before anything is allocated.
func ParseStripe(b []byte) (*Stripe, error) {
	const head = 11
	if len(b) < head || string(b[:4]) != stripeMagic {
		return nil, fmt.Errorf("%d bytes without the magic %q: %w", len(b), stripeMagic, ErrBadStripe)
	}
	r := &Stripe{K: int(b[4]), M: int(b[5]), ShardSize: binary.BigEndian.Uint32(b[7:11])}
	n := int(b[6])
	if n < 1 || n > MaxStripeData || r.M < 1 || r.M > MaxStripeParity {
		return nil, fmt.Errorf("%d chunks, m = %d: %w", n, r.M, ErrBadStripe)
	}
	if want := head + 36*n + 32*r.M; len(b) != want {
		return nil, fmt.Errorf("%d bytes, want %d for %d chunks and m = %d: %w", len(b), want, n, r.M, ErrBadStripe)
	}
	r.Chunks = make([]ChunkRef, n)
	o := head
	for i := range r.Chunks {
		copy(r.Chunks[i].ID[:], b[o:o+32])
		r.Chunks[i].Len = binary.BigEndian.Uint32(b[o+32 : o+36])
		o += 36
	}
	r.Parity = make([]ID, r.M)
	for i := range r.Parity {
		copy(r.Parity[i][:], b[o:o+32])
		o += 32
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return r, nil
}

// FileStripes is one file of SetFilesStripes: its path, the manifest a
// conversion read (Old) and the stripes its new manifest names.
type FileStripes struct {
	Path    string
	Old     ID
	Stripes []*Stripe
}

// SetFileStripes replaces the manifest of the file at path, which must
// still be old, by one with the same chunks naming stripes (empty: the
// file is kept by replicas again). A file whose manifest is no longer old
// is ErrFileChanged. It returns the new manifest's id.
func (s *Store) SetFileStripes(path string, old ID, stripes []*Stripe) (ID, error) {
	ids, changed, err := s.SetFilesStripes([]FileStripes{{Path: path, Old: old, Stripes: stripes}})
	if err != nil {
		return ID{}, err
	}
	if len(changed) > 0 {
		return ID{}, &PathError{Op: "set stripes", Path: path, Err: ErrFileChanged}
	}
	return ids[0], nil
}

// SetFilesStripes gives each file its stripes in one namespace update: a
// new manifest with the same chunks naming them (docs/design/erasure.md);
// each entry keeps its metadata (the content is the same) and takes the
// update's HLC, so a namespace merge spreads the change. Each stripe must
// pass Check and name a chunk of its file (else nothing changes). A file
// whose manifest is no longer Old (written, replaced or removed meanwhile)
// is left alone and its path returned in changed: a conversion that read
// Old must not overwrite newer content. ids are the new manifests' ids
// (zero for a changed file).
func (s *Store) SetFilesStripes(files []FileStripes) (ids []ID, changed []string, err error) {
	err = s.Update(func(tx *NSTx) error {
		ids, changed = make([]ID, len(files)), nil
		for i, f := range files {
			e, err := tx.Lookup(f.Path)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			if err != nil || e.Kind != KindFile || e.ID != f.Old {
				changed = append(changed, f.Path)
				continue
			}
			m, err := s.FileManifest(f.Old)
			if err != nil {
				return err
			}
			mine := make(map[ID]bool, len(m.Chunks))
			for _, c := range m.Chunks {
				mine[c.ID] = true
			}
			nm := &FileManifest{Size: m.Size, Format: m.Format, Chunks: m.Chunks}
			for _, r := range f.Stripes {
				if err := r.Check(); err != nil {
					return fmt.Errorf("set stripes of %s: %w", f.Path, err)
				}
				if !slices.ContainsFunc(r.Chunks, func(c ChunkRef) bool { return mine[c.ID] }) {
					return fmt.Errorf("set stripes of %s: a stripe names none of its chunks: %w", f.Path, ErrBadStripe)
				}
				nm.Stripes = append(nm.Stripes, r)
			}
			ids[i] = tx.PutFile(nm)
			if ids[i] == f.Old {
				continue
			}
			e.ID = ids[i] // the content is the same: mtime and ctime stay
			if err := tx.Put(f.Path, e); err != nil {
				return err
			}
		}
		return nil
	})
	return ids, changed, err
}
