package gpuio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/chunking"
	"github.com/kylix/kylix/chunkstore/safetensors"
)

// Per-rank layouts (docs/design/ranklayout.md): a tensor-parallel rank's
// share of a row-parallel tensor (split along a dimension past the first)
// is a strided set of rows, and LoadTensors reads the rows it spans, most
// of the tensor. A rank layout is a safetensors file with the rank's share
// of every tensor back to back (chunkstore.PutRankLayout), which the rank
// then loads as one run.

// RankLayoutsResult sums up MakeRankLayouts.
type RankLayoutsResult struct {
	Path   string        `json:"path"`
	Source chunkstore.ID `json:"source"` // the file version the layouts were made from
	TPSize int           `json:"tp_size"`
	// Strided: tensors whose share is strided rows (what a layout is for).
	Strided int             `json:"strided_tensors"`
	Ranks   []RankLayoutOut `json:"ranks"`
	// Bytes: the layouts' bytes together; NewBytes: what they stored that
	// was not stored before (the extra bytes on disk: a share every rank
	// keeps, or that starts where the source's chunks do, shares them).
	Bytes    int64 `json:"bytes"`
	NewBytes int64 `json:"new_bytes"`
}

// RankLayoutOut is one rank's layout.
type RankLayoutOut struct {
	Rank     int           `json:"rank"`
	ID       chunkstore.ID `json:"id"`
	Bytes    int64         `json:"bytes"`
	NewBytes int64         `json:"new_bytes"`
}

// ErrNoRankLayout is returned by MakeRankLayouts for a safetensors file a
// layout would not help: no tensor's share is strided.
var ErrNoRankLayout = errors.New("no tensor of the file is split past its first dimension")

// ErrNotSafetensors is returned by MakeRankLayouts for a file that is not
// stored as safetensors: it has no tensors to share out.
var ErrNotSafetensors = errors.New("not a safetensors file")

// sharePart is one tensor of a rank layout: its share of the source.
type sharePart struct {
	out int64 // offset in the layout file
	src int64 // the tensor's offset in the source file
	sl  ShareLayout
}

// shareReader reads a rank layout as it would be written: the header,
// then each tensor's share gathered from the source file (verified chunk
// by chunk as the store reads them).
type shareReader struct {
	ctx    context.Context
	src    *chunkstore.File
	prefix []byte
	parts  []sharePart
	size   int64
}

func (r *shareReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= r.size {
		return 0, io.EOF
	}
	want := len(p)
	if int64(want) > r.size-off {
		p = p[:r.size-off]
	}
	n := 0
	if off < int64(len(r.prefix)) {
		n = copy(p, r.prefix[off:])
	}
	for _, pt := range r.parts {
		if n == len(p) {
			break
		}
		at := off + int64(n)
		if at >= pt.out+pt.sl.Bytes || pt.sl.Bytes == 0 {
			continue
		}
		rel := at - pt.out
		k := min(int64(len(p)-n), pt.sl.Bytes-rel)
		if err := r.gather(p[n:n+int(k)], pt, rel); err != nil {
			return n, err
		}
		n += int(k)
	}
	if n < want {
		return n, io.EOF
	}
	return n, nil
}

// gather copies len(dst) bytes of part pt's share from offset rel of the
// share: contiguous shares are one read; strided ones read the source span
// covering their rows once and pick each row's piece.
func (r *shareReader) gather(dst []byte, pt sharePart, rel int64) error {
	sl := pt.sl
	if sl.Rows == 1 || sl.Width == sl.Pitch {
		_, err := r.src.ReadAtContext(r.ctx, dst, pt.src+sl.ColOff+rel)
		return err
	}
	r0, r1 := rel/sl.Width, (rel+int64(len(dst))-1)/sl.Width
	lo := pt.src + r0*sl.Pitch + sl.ColOff
	span := make([]byte, (r1-r0)*sl.Pitch+sl.Width)
	if _, err := r.src.ReadAtContext(r.ctx, span, lo); err != nil {
		return err
	}
	n := 0
	for row := r0; row <= r1 && n < len(dst); row++ {
		from := int64(0)
		if row == r0 {
			from = rel % sl.Width
		}
		n += copy(dst[n:], span[(row-r0)*sl.Pitch+from:(row-r0)*sl.Pitch+sl.Width])
	}
	return nil
}

// rankLayoutOf returns the header bytes and parts of rank's layout of the
// safetensors file whose header is h, and how many of its tensors have a
// strided share.
func rankLayoutOf(h *safetensors.Header, src chunkstore.ID, rank, tp int) ([]byte, []sharePart, int, error) {
	specs := make([]safetensors.TensorSpec, len(h.Tensors))
	sls := make([]ShareLayout, len(h.Tensors))
	strided := 0
	for i, t := range h.Tensors {
		sl, err := TPShare(t, rank, tp).Layout(t)
		if err != nil {
			return nil, nil, 0, err
		}
		if sl.Rows > 1 && sl.Width < sl.Pitch {
			strided++
		}
		specs[i], sls[i] = safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: sl.Shape}, sl
	}
	meta := map[string]string{}
	for k, v := range h.Metadata {
		meta[k] = v
	}
	meta["kylix.rank_layout"] = "tp_size=" + strconv.Itoa(tp) + " rank=" + strconv.Itoa(rank) + " source=" + src.String()
	meta["kylix.tp_rules"] = tpRulesDigest
	prefix, oh, err := safetensors.EncodeHeader(specs, meta)
	if err != nil {
		return nil, nil, 0, err
	}
	parts := make([]sharePart, len(h.Tensors))
	for i, t := range h.Tensors {
		ot, _ := oh.Tensor(t.Name)
		parts[i] = sharePart{out: oh.DataStart() + ot.Begin, src: h.DataStart() + t.Begin, sl: sls[i]}
	}
	return prefix, parts, strided, nil
}

// layoutSpans cuts a rank layout where its source's chunks are cut, so
// that the two share them: the header is one span; a contiguous share (a
// whole tensor, or a piece along dimension 0) is cut on the source
// tensor's chunk grid (chunking.DefaultTensorChunk from the tensor's
// start, as TensorSpans cut it), so only its first and last pieces can be
// new; a strided share, whose bytes the source holds nowhere in a row, is
// cut every DefaultTensorChunk from its start.
func layoutSpans(prefix []byte, parts []sharePart, size int64) []chunking.Span {
	const c = chunking.DefaultTensorChunk
	spans := []chunking.Span{{Off: 0, Len: int64(len(prefix))}}
	at := int64(len(prefix))
	cut := func(to int64) {
		if to > at {
			spans = append(spans, chunking.Span{Off: at, Len: to - at})
			at = to
		}
	}
	for _, pt := range parts {
		end := pt.out + pt.sl.Bytes
		if pt.sl.Bytes == 0 {
			continue
		}
		cut(pt.out) // nothing between shares (EncodeHeader packs them), but keep the tiling whole
		first := pt.out + c
		if pt.sl.Rows == 1 || pt.sl.Width == pt.sl.Pitch {
			// The next grid line of the source tensor after the share's start.
			first = pt.out + (c-pt.sl.ColOff%c)%c
			if first == pt.out {
				first += c
			}
		}
		for o := first; o < end; o += c {
			cut(o)
		}
		cut(end)
	}
	cut(size)
	return spans
}

// MakeRankLayouts stores a rank layout for each rank of tensor-parallel
// size tp of the safetensors file at path (its current version), each
// made of the bytes of the shares kylix load --tp-size places, read from
// the store and verified. progress gets the layout bytes written so far of
// all ranks. A file with no strided share gets none (ErrNoRankLayout).
func MakeRankLayouts(ctx context.Context, s *chunkstore.Store, path string, tp int, progress func(done, total int64)) (RankLayoutsResult, error) {
	res := RankLayoutsResult{Path: path, TPSize: tp}
	if tp < 2 {
		return res, fmt.Errorf("rank layouts of %s: tensor-parallel size %d: give 2 or more", path, tp)
	}
	f, _, err := s.OpenPath(path)
	if err != nil {
		return res, err
	}
	res.Source = f.ID
	if f.M.Format != chunkstore.FormatSafetensors {
		return res, fmt.Errorf("rank layouts of %s: %w", path, ErrNotSafetensors)
	}
	h, err := safetensors.Parse(f, f.Size())
	if err != nil {
		return res, fmt.Errorf("rank layouts of %s: %w", path, err)
	}
	type rankPlan struct {
		prefix []byte
		parts  []sharePart
		size   int64
	}
	plans := make([]rankPlan, tp)
	var total int64
	for rank := range tp {
		prefix, parts, strided, err := rankLayoutOf(h, f.ID, rank, tp)
		if err != nil {
			return res, fmt.Errorf("rank layouts of %s: %w", path, err)
		}
		res.Strided = strided
		size := int64(len(prefix))
		if len(parts) > 0 {
			last := parts[len(parts)-1]
			size = last.out + last.sl.Bytes
		}
		plans[rank] = rankPlan{prefix, parts, size}
		total += size
	}
	if res.Strided == 0 {
		return res, fmt.Errorf("rank layouts of %s: %w: each rank's share already reads as whole runs", path, ErrNoRankLayout)
	}
	var done int64
	for rank, p := range plans {
		r := &shareReader{ctx: ctx, src: f, prefix: p.prefix, parts: p.parts, size: p.size}
		pr, err := s.PutRankLayout(ctx, f.ID, tp, rank, r, p.size, layoutSpans(p.prefix, p.parts, p.size), func(n int64) {
			done += n
			if progress != nil {
				progress(done, total)
			}
		})
		if err != nil {
			return res, fmt.Errorf("rank layouts of %s: rank %d: %w", path, rank, err)
		}
		res.Ranks = append(res.Ranks, RankLayoutOut{Rank: rank, ID: pr.ID, Bytes: p.size, NewBytes: pr.NewBytes})
		res.Bytes += p.size
		res.NewBytes += pr.NewBytes
	}
	return res, nil
}

// OpenRankLayout returns rank's stored layout of tensor-parallel size tp
// for file f (whose header is h), with its header, checked against the
// shares TPShare gives: the same tensors, dtypes and share shapes; a
// layout not made on this member is refused (chunkstore.RankLayoutMadeHere). No
// layout stored is (nil, nil, nil); one that does not match is an error
// saying why (the caller loads the strided shares instead).
func OpenRankLayout(s *chunkstore.Store, f *chunkstore.File, h *safetensors.Header, rank, tp int) (*chunkstore.File, *safetensors.Header, error) {
	lf, err := s.OpenRankLayout(f.ID, tp, rank)
	if errors.Is(err, chunkstore.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if !s.RankLayoutMadeHere(lf.ID) {
		// Merged from another member: its bytes were not gathered from
		// the verified source here (chunkstore: layoutsMade).
		return nil, nil, fmt.Errorf("rank layout tp%d-rank%d was made on another member, not here: kylix layout --tp-size %d on this member makes it here (the same bytes, nothing new stored)", tp, rank, tp)
	}
	lh, err := safetensors.Parse(lf, lf.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("rank layout tp%d-rank%d: %w", tp, rank, err)
	}
	if got := lh.Metadata["kylix.tp_rules"]; got != tpRulesDigest {
		return nil, nil, fmt.Errorf("rank layout tp%d-rank%d: made under other split rules (%q, these are %q): make it again with kylix layout", tp, rank, got, tpRulesDigest)
	}
	if len(lh.Tensors) != len(h.Tensors) {
		return nil, nil, fmt.Errorf("rank layout tp%d-rank%d: %d tensors, the file has %d", tp, rank, len(lh.Tensors), len(h.Tensors))
	}
	for _, t := range h.Tensors {
		sl, err := TPShare(t, rank, tp).Layout(t)
		if err != nil {
			return nil, nil, err
		}
		lt, ok := lh.Tensor(t.Name)
		if !ok || lt.DType != t.DType || lt.Size() != sl.Bytes || !slices.Equal(lt.Shape, sl.Shape) {
			return nil, nil, fmt.Errorf("rank layout tp%d-rank%d: tensor %s is not the share the split rules give (made under other rules?)", tp, rank, t.Name)
		}
	}
	return lf, lh, nil
}

// tpRulesDigest names the split rules a layout was made under (its
// "kylix.tp_rules" metadata): a layout made under other rules is not used.
var tpRulesDigest = func() string {
	var b []byte
	for _, r := range tpRules {
		b = fmt.Appendf(b, "%q %d\n", r.Pattern, r.Dim)
	}
	return chunkstore.Sum(b).Short()
}()

// RankLayoutIndex says, for one file version, where its stored rank
// layouts hold each strided share: a GPU fill asked for a share as one
// strided range (rows of Width bytes, Pitch apart, from the row's first
// byte) reads it from a layout as one contiguous run instead.
type RankLayoutIndex struct {
	files []*chunkstore.File
	at    map[shareKey]layoutAt
}

type shareKey struct{ off, width, rows, pitch int64 }

type layoutAt struct {
	file int
	off  int64
}

// NewRankLayoutIndex indexes the stored rank layouts of file f; nil (and
// no error) when none is stored. A layout that does not match the split
// rules is left out and named in skipped.
func NewRankLayoutIndex(s *chunkstore.Store, f *chunkstore.File) (x *RankLayoutIndex, skipped []string, err error) {
	ls, err := s.RankLayouts(f.ID)
	if err != nil || len(ls) == 0 || f.M.Format != chunkstore.FormatSafetensors {
		return nil, nil, err
	}
	h, err := safetensors.Parse(f, f.Size())
	if err != nil {
		return nil, nil, err
	}
	x = &RankLayoutIndex{at: map[shareKey]layoutAt{}}
	for _, l := range ls {
		lf, lh, err := OpenRankLayout(s, f, h, l.Rank, l.TPSize)
		if err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		if lf == nil {
			continue
		}
		for _, t := range h.Tensors {
			sl, _ := TPShare(t, l.Rank, l.TPSize).Layout(t) // OpenRankLayout checked it
			if sl.Rows <= 1 || sl.Width == sl.Pitch || sl.Bytes == 0 {
				continue
			}
			lt, _ := lh.Tensor(t.Name)
			k := shareKey{h.DataStart() + t.Begin + sl.ColOff, sl.Width, sl.Rows, sl.Pitch}
			x.at[k] = layoutAt{len(x.files), lh.DataStart() + lt.Begin}
		}
		x.files = append(x.files, lf)
	}
	if len(x.files) == 0 {
		return nil, skipped, nil
	}
	return x, skipped, nil
}

// Find returns the layout holding the strided share that starts at off
// (rows of width bytes, pitch apart) and the share's offset in it.
func (x *RankLayoutIndex) Find(off, width, rows, pitch int64) (*chunkstore.File, int64, bool) {
	if x == nil {
		return nil, 0, false
	}
	a, ok := x.at[shareKey{off, width, rows, pitch}]
	if !ok {
		return nil, 0, false
	}
	return x.files[a.file], a.off, true
}

// RankLayoutsFile is one file of MakeRankLayoutsBelow: its layouts, or
// why it got none.
type RankLayoutsFile struct {
	Path    string             `json:"path"`
	Made    *RankLayoutsResult `json:"made,omitempty"`
	Skipped string             `json:"skipped,omitempty"`
}

// MakeRankLayoutsBelow is MakeRankLayouts for each file at or below path
// (a content stored under several names once), in path order. Files that
// are not safetensors are counted in others; a safetensors file with no
// strided share is listed with Skipped set. progress gets each file's.
func MakeRankLayoutsBelow(ctx context.Context, s *chunkstore.Store, path string, tp int, progress func(file string, done, total int64)) (files []RankLayoutsFile, others int, err error) {
	below, err := s.FilesBelow(ctx, path)
	if err != nil {
		return nil, 0, fmt.Errorf("rank layouts of %s: %w", path, err)
	}
	for _, pf := range below {
		if pf.Again {
			continue
		}
		res, err := MakeRankLayouts(ctx, s, pf.Path, tp, func(done, total int64) {
			if progress != nil {
				progress(pf.Path, done, total)
			}
		})
		switch {
		case errors.Is(err, ErrNotSafetensors):
			others++
		case errors.Is(err, ErrNoRankLayout):
			files = append(files, RankLayoutsFile{Path: pf.Path, Skipped: err.Error()})
		case err != nil:
			return files, others, err
		default:
			files = append(files, RankLayoutsFile{Path: pf.Path, Made: &res})
		}
	}
	return files, others, nil
}
