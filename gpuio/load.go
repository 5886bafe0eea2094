package gpuio

import (
	"context"
	"fmt"
	"sort"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
)

// ReadRange places bytes [off, off+n) of f at dst+dstOff.
func (l *Loader) ReadRange(ctx context.Context, f *chunkstore.File, off, n int64, dst DeviceMem, dstOff int64) (Result, error) {
	var res Result
	// Compared by subtraction: the offsets may come from another process
	// (the node's FILL), and off+n could overflow past the checks.
	if off < 0 || n < 0 || off > f.Size() || n > f.Size()-off {
		return res, fmt.Errorf("range [%d, +%d) outside the file's %d bytes", off, n, f.Size())
	}
	if dstOff < 0 || dstOff > dst.Size() || n > dst.Size()-dstOff {
		return res, fmt.Errorf("range of %d bytes at %d does not fit device memory of %d bytes", n, dstOff, dst.Size())
	}
	// The plan's leases keep GC from deleting the packs while they are read
	// (docs/design/access.md).
	plan, err := f.Plan(off, n)
	if err != nil {
		return res, err
	}
	defer plan.Release()
	gs, err := planGroups(f, plan.Pieces, off, n, l.opts.BufferSize)
	if err != nil {
		return res, err
	}
	jobs := make([]job, len(gs))
	hv, unified := dst.(HostViewer)
	for i, g := range gs {
		jobs[i] = job{g: g, place: linear(dst, dstOff, off)}
		if l.path == PathUnified && unified && g.copyStart == g.fileOff && g.copyEnd == g.fileOff+g.dataLen {
			o := dstOff + g.fileOff - off
			jobs[i].into = hv.HostView()[o : o+g.dataLen]
		}
	}
	err = l.run(ctx, jobs, &res)
	return res, err
}

// Share selects one tensor-parallel rank's part of a tensor: the tensor is
// cut along dimension Dim as torch.chunk(Size, Dim) cuts it, and piece Rank
// is wanted. Pieces are ceil(d/Size) long, the last ones shorter, and ranks
// past the last piece get an empty share, so a dimension that does not
// divide evenly still loads, giving each rank what kylix.torch.load_file
// gives it. Size 1 (or a nil *Share) means the whole tensor.
type Share struct {
	Dim  int
	Rank int
	Size int
}

// ShareLayout describes where a share's bytes are inside a tensor: Rows rows
// Pitch bytes apart, of which bytes [ColOff, ColOff+Width) are wanted. A share
// along dimension 0 is one row (a contiguous range).
type ShareLayout struct {
	Shape  []int64 // the share's shape
	Bytes  int64   // Rows x Width
	Rows   int64
	Pitch  int64
	ColOff int64
	Width  int64
}

// Layout computes where share s of tensor t lies.
func (s *Share) Layout(t safetensors.Tensor) (ShareLayout, error) {
	es := t.DType.ElemSize()
	if s == nil || s.Size <= 1 {
		return ShareLayout{Shape: t.Shape, Bytes: t.Size(), Rows: 1, Pitch: t.Size(), Width: t.Size()}, nil
	}
	if s.Dim < 0 || s.Dim >= len(t.Shape) {
		return ShareLayout{}, fmt.Errorf("tensor %s of rank %d has no dimension %d to split", t.Name, len(t.Shape), s.Dim)
	}
	if s.Rank < 0 || s.Rank >= s.Size {
		return ShareLayout{}, fmt.Errorf("rank %d outside tensor-parallel size %d", s.Rank, s.Size)
	}
	d := t.Shape[s.Dim]
	start, end := chunkRange(d, s.Rank, s.Size)
	outer, inner := int64(1), es
	for _, x := range t.Shape[:s.Dim] {
		outer *= x
	}
	for _, x := range t.Shape[s.Dim+1:] {
		inner *= x
	}
	part := end - start
	shape := append([]int64(nil), t.Shape...)
	shape[s.Dim] = part
	l := ShareLayout{Shape: shape, Rows: outer, Pitch: d * inner, ColOff: start * inner, Width: part * inner}
	l.Bytes = l.Rows * l.Width
	return l, nil
}

// TensorTarget asks for one tensor (or its share) at Mem+Off.
type TensorTarget struct {
	Name  string
	Share *Share
	Mem   DeviceMem
	Off   int64
}

// LoadTensors places the listed tensors of the safetensors file f (whose
// parsed header is h). Tensors are loaded in file order whatever the order of
// targets, so the file is read front to back.
func (l *Loader) LoadTensors(ctx context.Context, f *chunkstore.File, h *safetensors.Header, targets []TensorTarget) (Result, error) {
	var res Result
	type want struct {
		t  safetensors.Tensor
		tt TensorTarget
		sl ShareLayout
	}
	ws := make([]want, 0, len(targets))
	for _, tt := range targets {
		t, ok := h.Tensor(tt.Name)
		if !ok {
			return res, fmt.Errorf("no tensor %q in the file", tt.Name)
		}
		sl, err := tt.Share.Layout(t)
		if err != nil {
			return res, err
		}
		if tt.Off < 0 || tt.Off+sl.Bytes > tt.Mem.Size() {
			return res, fmt.Errorf("tensor %s share of %d bytes at %d does not fit device memory of %d bytes", t.Name, sl.Bytes, tt.Off, tt.Mem.Size())
		}
		ws = append(ws, want{t, tt, sl})
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].t.Begin < ws[j].t.Begin })
	plan, err := f.Plan(0, f.Size())
	if err != nil {
		return res, err
	}
	defer plan.Release()
	layout := plan.Pieces
	var jobs []job
	for _, w := range ws {
		tstart := h.DataStart() + w.t.Begin
		// Only the rows the share touches are read.
		lo := tstart + w.sl.ColOff
		hi := tstart + (w.sl.Rows-1)*w.sl.Pitch + w.sl.ColOff + w.sl.Width
		if w.sl.Bytes == 0 {
			continue
		}
		gs, err := planGroups(f, layout, lo, hi-lo, l.opts.BufferSize)
		if err != nil {
			return res, fmt.Errorf("tensor %s: %w", w.t.Name, err)
		}
		var p placer
		if w.sl.Rows == 1 || w.sl.Width == w.sl.Pitch {
			p = linear(w.tt.Mem, w.tt.Off, lo)
		} else {
			p = strided(w.tt.Mem, w.tt.Off, tstart, w.sl.Pitch, w.sl.ColOff, w.sl.Width)
		}
		for _, g := range gs {
			jobs = append(jobs, job{g: g, place: p})
		}
	}
	err = l.run(ctx, jobs, &res)
	return res, err
}
