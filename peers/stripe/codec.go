package stripe

import (
	"fmt"
	"slices"

	"github.com/klauspost/reedsolomon"

	"github.com/kylix/kylix/chunkstore"
)

// Codec encodes and decodes stripes of one shape, k data and m parity
// shards. It is safe for concurrent use.
type Codec struct {
	k, m int
	enc  reedsolomon.Encoder
}

// Option sets how a Codec runs.
type Option func(*codecOptions)

type codecOptions struct{ threads int }

// WithThreads bounds the goroutines one Encode or decode uses (default:
// reedsolomon's choice by shard size, up to GOMAXPROCS; 1: the calling
// goroutine only, the per-core figure of docs/bench.md).
func WithThreads(n int) Option { return func(o *codecOptions) { o.threads = n } }

// New returns a Codec for k data and m parity shards.
func New(k, m int, opts ...Option) (*Codec, error) {
	if k < 1 || k > MaxData || m < 1 || m > MaxParity {
		return nil, fmt.Errorf("stripe of %d+%d shards: want k 1 to %d and m 1 to %d: %w", k, m, MaxData, MaxParity, ErrBadRecord)
	}
	var o codecOptions
	for _, f := range opts {
		f(&o)
	}
	var ro []reedsolomon.Option
	if o.threads > 0 {
		ro = append(ro, reedsolomon.WithMaxGoroutines(o.threads))
	}
	enc, err := reedsolomon.New(k, m, ro...)
	if err != nil {
		return nil, fmt.Errorf("reed-solomon %d+%d: %w", k, m, err)
	}
	return &Codec{k: k, m: m, enc: enc}, nil
}

// K and M are the codec's shape.
func (c *Codec) K() int { return c.k }

// M is the number of parity shards.
func (c *Codec) M() int { return c.m }

// Chunk is one member chunk given to Encode: its id and bytes.
type Chunk struct {
	ID   chunkstore.ID
	Data []byte
}

// Encode makes the stripe of chunks (1 to k, in shard order) and returns
// its record and the m parity shards (each ShardSize bytes, stored under
// the record's parity ids). parity may hold m buffers to write the parity
// into (reused when their capacity is ShardSize or more; a conversion
// coding many stripes keeps its own), else nil. The chunks' ids are taken
// as given, not hashed again: they come from a store that verified them. A
// chunk whose bytes do not match its id makes a stripe that decodes to an
// error, never to wrong bytes (every rebuilt chunk is checked against its
// id).
func (c *Codec) Encode(chunks []Chunk, parity [][]byte) (*Record, [][]byte, error) {
	r, parity, err := c.encodeParity(chunks, parity)
	if err != nil {
		return nil, nil, err
	}
	r.Parity = make([]chunkstore.ID, c.m)
	for j, p := range parity {
		r.Parity[j] = chunkstore.Sum(p)
	}
	return r, parity, nil
}

// encodeParity is Encode without the parity's ids.
func (c *Codec) encodeParity(chunks []Chunk, parity [][]byte) (*Record, [][]byte, error) {
	if len(chunks) < 1 || len(chunks) > c.k {
		return nil, nil, fmt.Errorf("%d chunks for a stripe of k = %d: %w", len(chunks), c.k, ErrBadRecord)
	}
	if parity != nil && len(parity) != c.m {
		return nil, nil, fmt.Errorf("%d parity buffers for m = %d: %w", len(parity), c.m, ErrBadRecord)
	}
	r := &Record{K: c.k, M: c.m, Chunks: make([]Member, len(chunks))}
	for i, ch := range chunks {
		if len(ch.Data) < 1 || len(ch.Data) > chunkstore.MaxChunkLen {
			return nil, nil, fmt.Errorf("chunk %s of %d bytes: %w", ch.ID.Short(), len(ch.Data), ErrBadRecord)
		}
		r.Chunks[i] = Member{ID: ch.ID, Len: uint32(len(ch.Data))}
		r.ShardSize = max(r.ShardSize, uint32(len(ch.Data)))
	}
	size := int(r.ShardSize)
	shards := make([][]byte, c.k+c.m)
	var zero []byte
	for i := range c.k {
		switch {
		case i >= len(chunks):
			if zero == nil {
				zero = make([]byte, size)
			}
			shards[i] = zero
		case len(chunks[i].Data) < size:
			shards[i] = padded(chunks[i].Data, size)
		default:
			shards[i] = chunks[i].Data
		}
	}
	out := make([][]byte, c.m)
	for j := range out {
		if parity != nil && cap(parity[j]) >= size {
			out[j] = parity[j][:size]
		} else {
			out[j] = make([]byte, size)
		}
		shards[c.k+j] = out[j]
	}
	if err := c.enc.Encode(shards); err != nil {
		return nil, nil, fmt.Errorf("reed-solomon encode: %w", err)
	}
	return r, out, nil
}

// padded returns b zero-padded to size in a buffer of its own.
func padded(b []byte, size int) []byte {
	p := make([]byte, size)
	copy(p, b)
	return p
}

// Shards gathers the shards of one stripe that a reader has, each checked
// before it is kept.
type Shards struct {
	r    *Record
	data [][]byte // by shard index; nil: not (yet) given
	have int
}

// NewShards starts gathering shards of r.
func NewShards(r *Record) (*Shards, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	return &Shards{r: r, data: make([][]byte, r.Shards())}, nil
}

// Add checks shard i against its length and BLAKE3 in the record (a data
// shard: its chunk's length, unpadded, and id) and keeps it. A shard that
// fails is not kept: ErrBadShard, and the reader asks elsewhere or for
// another shard.
func (s *Shards) Add(i int, b []byte) error {
	id, _, err := s.expect(i, b)
	if err != nil {
		return err
	}
	if chunkstore.Sum(b) != id {
		return fmt.Errorf("shard %d of a stripe: BLAKE3 is not %s: %w", i, id.Short(), ErrBadShard)
	}
	s.keep(i, b)
	return nil
}

// AddVerified keeps shard i whose bytes the caller already checked against
// ShardID(i) (fetched through a chunkstore.VerifiedFetcher, which hashes
// every chunk as it arrives: the hash is not paid twice). Its length is
// still checked.
func (s *Shards) AddVerified(i int, b []byte) error {
	if _, _, err := s.expect(i, b); err != nil {
		return err
	}
	s.keep(i, b)
	return nil
}

func (s *Shards) expect(i int, b []byte) (chunkstore.ID, uint32, error) {
	id, size, ok := s.r.ShardID(i)
	if !ok {
		return id, 0, fmt.Errorf("shard %d of a stripe of %d+%d with %d chunks: no such stored shard: %w", i, s.r.K, s.r.M, len(s.r.Chunks), ErrBadShard)
	}
	if uint32(len(b)) != size {
		return id, 0, fmt.Errorf("shard %d of a stripe: %d bytes, want %d: %w", i, len(b), size, ErrBadShard)
	}
	return id, size, nil
}

func (s *Shards) keep(i int, b []byte) {
	if s.data[i] == nil {
		s.have++
	}
	s.data[i] = b
}

// Good is the number of stored shards kept so far; with the known zero
// shards of a short stripe, Good()+K-len(Chunks) >= K rebuilds every chunk.
func (s *Shards) Good() int { return s.have }

// Enough reports whether the shards kept rebuild every chunk.
func (s *Shards) Enough() bool { return s.have+s.r.K-len(s.r.Chunks) >= s.r.K }

// Chunk returns member chunk i (0 <= i < len(Chunks)): the shard as kept
// when it was given, else rebuilt from the others and checked against
// its id.
func (c *Codec) Chunk(s *Shards, i int) ([]byte, error) {
	out, err := c.Chunks(s, []int{i})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// Chunks returns the member chunks named by want, in that order: each as
// kept when it was given, else rebuilt from the others and checked against
// its id. Rebuilding needs k good shards (the stripe's known zero shards
// count); with fewer it returns ErrTooFewShards (also
// chunkstore.ErrNotLocal). A rebuilt chunk that fails its id (shards that
// passed their checks yet do not belong together: a record that lies, or
// AddVerified misused) is chunkstore.ErrCorrupt. Never wrong bytes.
func (c *Codec) Chunks(s *Shards, want []int) ([][]byte, error) {
	out := make([][]byte, len(want))
	if err := c.chunks(s, want, out, false); err != nil {
		return nil, err
	}
	return out, nil
}

// ChunksInto is Chunks into memory the caller provides: dst[j] (its length
// chunk want[j]'s) holds that chunk, copied as given or rebuilt and checked
// against its id, when it returns nil; on an error their bytes are
// undefined and must not be used. A dst[j] of capacity ShardSize or more is
// rebuilt in place (the bytes of its capacity past the chunk, up to
// ShardSize, are overwritten with padding), others in a buffer of their own
// and copied. A degraded read rebuilds straight into the reader's buffer
// this way.
func (c *Codec) ChunksInto(s *Shards, want []int, dst [][]byte) error {
	if len(dst) != len(want) {
		return fmt.Errorf("%d buffers for %d chunks: %w", len(dst), len(want), ErrBadRecord)
	}
	for j, i := range want {
		if i >= 0 && i < len(s.r.Chunks) && uint32(len(dst[j])) != s.r.Chunks[i].Len {
			return fmt.Errorf("chunk %d: a buffer of %d bytes for %d: %w", i, len(dst[j]), s.r.Chunks[i].Len, ErrBadRecord)
		}
	}
	return c.chunks(s, want, dst, true)
}

// chunks is Chunks (into false: out[j] is set to the chunk) and
// ChunksInto (into true: the chunk is written into out[j]).
func (c *Codec) chunks(s *Shards, want []int, out [][]byte, into bool) error {
	r := s.r
	if r.K != c.k || r.M != c.m {
		return fmt.Errorf("a stripe of %d+%d given to a %d+%d codec: %w", r.K, r.M, c.k, c.m, ErrBadRecord)
	}
	var rebuild []int
	slots := map[int][]byte{} // shard index: the dst it is rebuilt in
	slotOf := map[int]int{}   // shard index: that dst's j
	for j, i := range want {
		if i < 0 || i >= len(r.Chunks) {
			return fmt.Errorf("chunk %d of a stripe of %d chunks: %w", i, len(r.Chunks), ErrBadRecord)
		}
		if b := s.data[i]; b != nil {
			if into {
				copy(out[j], b)
			} else {
				out[j] = b
			}
			continue
		}
		if !slices.Contains(rebuild, i) {
			rebuild = append(rebuild, i)
		}
		if _, taken := slotOf[i]; into && cap(out[j]) >= int(r.ShardSize) && !taken {
			slots[i], slotOf[i] = out[j][:0], j
		}
	}
	if len(rebuild) == 0 {
		return nil
	}
	if !s.Enough() {
		return fmt.Errorf("%d good shards of %d stored, %d needed: %w (%w)", s.have, r.Stored(), len(r.Chunks), ErrTooFewShards, chunkstore.ErrNotLocal)
	}
	shards, err := c.rebuild(s, rebuild, slots)
	if err != nil {
		return err
	}
	for _, i := range rebuild {
		m := r.Chunks[i]
		if chunkstore.Sum(shards[i][:m.Len]) != m.ID {
			return fmt.Errorf("chunk %s rebuilt from its stripe fails its hash: %w", m.ID.Short(), chunkstore.ErrCorrupt)
		}
	}
	for j, i := range want {
		if s.data[i] != nil {
			continue
		}
		b := shards[i][:r.Chunks[i].Len]
		if !into {
			out[j] = b
		} else if k, ok := slotOf[i]; !ok || k != j {
			copy(out[j], b)
		}
	}
	// What was rebuilt is not kept in s: it is the caller's now (a later
	// call rebuilds it again).
	return nil
}

// rebuild returns the stripe's shards with the data shards in want that
// s lacks rebuilt (padded to the shard size), not yet checked against
// their ids: Chunks checks them. into may give a buffer (length 0,
// capacity at least the shard size) for a shard to be rebuilt in.
func (c *Codec) rebuild(s *Shards, want []int, into map[int][]byte) ([][]byte, error) {
	r := s.r
	size := int(r.ShardSize)
	shards := make([][]byte, r.Shards())
	var zero []byte
	for i := range shards {
		b := s.data[i]
		switch {
		case i >= len(r.Chunks) && i < r.K:
			if zero == nil {
				zero = make([]byte, size)
			}
			b = zero
		case b != nil && len(b) < size:
			b = padded(b, size)
		case b == nil && into[i] != nil:
			b = into[i][:0]
		}
		shards[i] = b
	}
	required := make([]bool, len(shards))
	for _, i := range want {
		required[i] = s.data[i] == nil
	}
	if err := c.enc.ReconstructSome(shards, required); err != nil {
		return nil, fmt.Errorf("reed-solomon rebuild: %w (%w)", err, chunkstore.ErrNotLocal)
	}
	return shards, nil
}
