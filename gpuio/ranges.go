package gpuio

import (
	"context"
	"fmt"
	"sort"

	"github.com/kylix/kylix/chunkstore"
)

// Range is one part of a batched read: N bytes of the file at Off, placed
// at DstOff in the destination. With Rows > 1 it is strided: Rows rows of
// N bytes, Pitch bytes apart in the file, packed densely at DstOff (row i
// at DstOff + i*N) — a tensor-parallel share split along a later
// dimension. Rows 0 means 1.
type Range struct {
	Off, N, DstOff int64
	Rows, Pitch    int64
}

func (r Range) rows() int64 { return max(1, r.Rows) }

// fileEnd is the end of the file bytes the range spans.
func (r Range) fileEnd() int64 { return r.Off + (r.rows()-1)*r.Pitch + r.N }

// Bytes is how many bytes the range places.
func (r Range) Bytes() int64 { return r.rows() * r.N }

// check validates r against a file of size bytes and a destination of
// dstSize bytes, by division and subtraction: the values may come from
// another process, and products or sums could overflow past the checks.
func (r Range) check(size, dstSize int64) error {
	if r.Off < 0 || r.N < 0 || r.Rows < 0 || r.DstOff < 0 || r.Off > size || r.N > size-r.Off {
		return fmt.Errorf("[%d, +%d) is outside the file's %d bytes", r.Off, r.N, size)
	}
	if rows := r.rows(); rows > 1 {
		if r.Pitch < r.N || r.Pitch <= 0 {
			return fmt.Errorf("%d rows of %d bytes with a pitch of %d: rows must not overlap", rows, r.N, r.Pitch)
		}
		if rows-1 > (size-r.Off-r.N)/r.Pitch {
			return fmt.Errorf("%d rows of %d bytes, %d apart, from %d pass the file's end (%d bytes)", rows, r.N, r.Pitch, r.Off, size)
		}
	}
	if r.DstOff > dstSize || (r.N > 0 && r.rows() > (dstSize-r.DstOff)/r.N) {
		return fmt.Errorf("%d x %d bytes at %d do not fit device memory of %d bytes", r.rows(), r.N, r.DstOff, dstSize)
	}
	return nil
}

// spanGap is how far apart two ranges may lie in the file and still be read
// as one span: the bytes between them are read (they share chunks anyway at
// that distance) but not placed.
const spanGap = 1 << 20

// ReadRanges places every range of f into dst in one pipeline run, so that
// many small ranges (a tensor-parallel share: one per tensor) keep all the
// loader's buffers busy, as one large range does. Ranges that lie back to
// back in the file (or nearly) are read as one span, so a chunk that holds
// the end of one range and the start of the next is read and verified
// once. Ranges may come in any order and may overlap in the file; every
// range is checked against the file and dst before anything is read.
func (l *Loader) ReadRanges(ctx context.Context, f *chunkstore.File, ranges []Range, dst DeviceMem) (Result, error) {
	return l.ReadRangesWith(ctx, f, ranges, dst, ReadOptions{})
}

// ReadOptions adjust one ReadRangesWith call.
type ReadOptions struct {
	// Shared says that other loaders (other devices: the ranks of one
	// tensor-parallel job) read the same bytes at the same time. With
	// IOAuto, bytes not in the page cache are then read through it rather
	// than with O_DIRECT, so the kernel reads each page from the disk once
	// for all of them (a reader that finds a page being read waits for
	// it), where O_DIRECT would read it once per device. Asked at each
	// read (each group of chunks), since the others may start later.
	Shared func() bool
	// VerifyEveryLoad hashes every chunk of this load, even those of
	// pinned pages that were hashed when pinned (PinnedRange.verified),
	// which are otherwise placed as they are (Result.VerifyOn "pin").
	VerifyEveryLoad bool
}

// ReadRangesWith is ReadRanges with options.
func (l *Loader) ReadRangesWith(ctx context.Context, f *chunkstore.File, ranges []Range, dst DeviceMem, o ReadOptions) (Result, error) {
	var res Result
	rs := make([]Range, 0, len(ranges))
	for i, r := range ranges {
		if err := r.check(f.Size(), dst.Size()); err != nil {
			return res, fmt.Errorf("range %d: %s", i, err)
		}
		if r.N > 0 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return res, nil
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Off < rs[j].Off })
	var jobs []job
	for i := 0; i < len(rs); {
		lo, hi, j := rs[i].Off, rs[i].fileEnd(), i+1
		for j < len(rs) && rs[j].Off <= hi+spanGap {
			hi = max(hi, rs[j].fileEnd())
			j++
		}
		// The plan's leases keep GC from deleting the packs while they
		// are read (docs/design/access.md); released when run returns.
		plan, err := f.Plan(lo, hi-lo)
		if err != nil {
			return res, err
		}
		defer plan.Release()
		gs, err := planGroups(f, plan.Pieces, lo, hi-lo, l.opts.BufferSize)
		if err != nil {
			return res, err
		}
		p := multiLinear(dst, rs[i:j])
		for _, g := range gs {
			jobs = append(jobs, job{g: g, place: p, shared: o.Shared, verifyEveryLoad: o.VerifyEveryLoad})
		}
		i = j
	}
	err := l.run(ctx, jobs, &res)
	return res, err
}

// multiLinear places, from each group, the part of every range (sorted by
// file offset) that the group holds: a copy for a plain range, and for a
// strided one a 2D copy of its whole rows in the group plus the (at most
// two) rows the group cuts.
func multiLinear(dst DeviceMem, rs []Range) placer {
	// reach[i] is the furthest end of rs[0..i]: non-decreasing, so the
	// first range that can reach into a group is found by binary search
	// even when ranges overlap one another.
	reach := make([]int64, len(rs))
	for i, r := range rs {
		reach[i] = r.fileEnd()
		if i > 0 {
			reach[i] = max(reach[i], reach[i-1])
		}
	}
	return func(c copier, base int64, g group) ([]Transfer, int64, error) {
		var ts []Transfer
		var placed int64
		k := sort.Search(len(rs), func(i int) bool { return reach[i] > g.copyStart })
		for ; k < len(rs) && rs[k].Off < g.copyEnd; k++ {
			r := rs[k]
			a, b := max(r.Off, g.copyStart), min(r.fileEnd(), g.copyEnd)
			if a >= b {
				continue
			}
			if r.rows() > 1 {
				cut := g
				cut.copyStart, cut.copyEnd = a, b
				pts, n, err := strided(dst, r.DstOff, r.Off, r.Pitch, 0, r.N)(c, base, cut)
				ts = append(ts, pts...)
				placed += n
				if err != nil {
					return ts, placed, err
				}
				continue
			}
			t, err := c.copy1D(dst, r.DstOff+(a-r.Off), a-base, int(b-a))
			if err != nil {
				return ts, placed, err
			}
			ts = append(ts, t)
			placed += b - a
		}
		return ts, placed, nil
	}
}
