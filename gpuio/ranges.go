package gpuio

import (
	"context"
	"fmt"
	"sort"

	"github.com/kylix/kylix/chunkstore"
)

// Range is one part of a batched read: N bytes of the file at Off, placed
// at DstOff in the destination.
type Range struct {
	Off, N, DstOff int64
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
}

// ReadRangesWith is ReadRanges with options.
func (l *Loader) ReadRangesWith(ctx context.Context, f *chunkstore.File, ranges []Range, dst DeviceMem, o ReadOptions) (Result, error) {
	var res Result
	rs := make([]Range, 0, len(ranges))
	for i, r := range ranges {
		// By subtraction: offsets may come from another process.
		if r.Off < 0 || r.N < 0 || r.Off > f.Size() || r.N > f.Size()-r.Off {
			return res, fmt.Errorf("gpuio: range %d [%d, +%d) outside the file's %d bytes", i, r.Off, r.N, f.Size())
		}
		if r.DstOff < 0 || r.DstOff > dst.Size() || r.N > dst.Size()-r.DstOff {
			return res, fmt.Errorf("gpuio: range %d of %d bytes at %d does not fit device memory of %d bytes", i, r.N, r.DstOff, dst.Size())
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
		lo, hi, j := rs[i].Off, rs[i].Off+rs[i].N, i+1
		for j < len(rs) && rs[j].Off <= hi+spanGap {
			hi = max(hi, rs[j].Off+rs[j].N)
			j++
		}
		// The plan's leases keep GC from deleting the packs while they
		// are read (docs/design/access.md); released when run returns.
		plan, err := f.Plan(lo, hi-lo)
		if err != nil {
			return res, fmt.Errorf("gpuio: %w", err)
		}
		defer plan.Release()
		gs, err := planGroups(plan.Pieces, lo, hi-lo, l.opts.BufferSize)
		if err != nil {
			return res, err
		}
		p := multiLinear(dst, rs[i:j])
		for _, g := range gs {
			jobs = append(jobs, job{g: g, place: p, shared: o.Shared})
		}
		i = j
	}
	err := l.run(ctx, jobs, &res)
	return res, err
}

// multiLinear places, from each group, the part of every range (sorted by
// file offset) that the group holds.
func multiLinear(dst DeviceMem, rs []Range) placer {
	// reach[i] is the furthest end of rs[0..i]: non-decreasing, so the
	// first range that can reach into a group is found by binary search
	// even when ranges overlap one another.
	reach := make([]int64, len(rs))
	for i, r := range rs {
		reach[i] = r.Off + r.N
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
			a, b := max(r.Off, g.copyStart), min(r.Off+r.N, g.copyEnd)
			if a >= b {
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
