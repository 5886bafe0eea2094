package chunkstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kylix/kylix/chunkstore/chunking"
)

// Rank layouts (docs/design/ranklayout.md). For one version of a
// safetensors file and a tensor-parallel size N, a rank layout is a
// safetensors file holding one rank's share of every tensor back to back,
// so that the rank reads its share as one run instead of strided rows of
// each row-parallel tensor. The store keeps them as ordinary files under a
// directory of the namespace root that is reserved and hidden, like the
// link table: LayoutDir/<source manifest id>/tp<N>-rank<r>.safetensors.
// So GC keeps their chunks, verify reads them, a namespace merge spreads
// them to the members, and no rule of their own was needed for any of
// that. The store does not know the split rules (gpuio's TPShare does): it
// stores what it is given under the source's id and hands it back.
//
// A layout names the file version it was made from, not a path: every
// path with that content uses it, and a file written since has a new id,
// so a stale layout is never read for it. Layouts whose source version no
// head reaches any more are removed by the next GC (Collect).

// LayoutDir is the directory of rank layouts in the namespace root. The
// name is reserved there: Put refuses it and lookups do not see it.
const LayoutDir = ".kylix-layouts"

// ReservedRoot reports whether name is reserved in the namespace root
// (the link table, the rank layouts, the policies): hidden from lookups,
// listings and the mount, refused by Put.
func ReservedRoot(name string) bool {
	return name == LinkTable || name == LayoutDir || name == PolicyDir
}

// RankLayout is one stored rank layout.
type RankLayout struct {
	Source ID    `json:"source"` // the file version it was made from
	TPSize int   `json:"tp_size"`
	Rank   int   `json:"rank"`
	ID     ID    `json:"id"` // its own manifest
	Bytes  int64 `json:"bytes"`
	// MadeHere: made on this member (only those are used; a layout
	// merged from another member is not, until made here too).
	MadeHere bool `json:"made_here"`
}

func rankLayoutName(tp, rank int) string { return fmt.Sprintf("tp%d-rank%d.safetensors", tp, rank) }

func parseRankLayoutName(name string) (tp, rank int, ok bool) {
	rest, ok := strings.CutSuffix(name, ".safetensors")
	if !ok {
		return 0, 0, false
	}
	rest, ok = strings.CutPrefix(rest, "tp")
	a, b, ok2 := strings.Cut(rest, "-rank")
	if !ok || !ok2 {
		return 0, 0, false
	}
	tp, err1 := strconv.Atoi(a)
	rank, err2 := strconv.Atoi(b)
	return tp, rank, err1 == nil && err2 == nil && tp > 1 && rank >= 0 && rank < tp
}

// PutRankLayout stores the n bytes of r (a safetensors file) as rank's
// layout for tensor-parallel size tp of file version src, replacing one
// stored before. The bytes are cut at spans (nil: as an import cuts a
// safetensors file) and hashed, so the layout shares chunks with its
// source wherever the cuts and bytes are the same.
func (s *Store) PutRankLayout(ctx context.Context, src ID, tp, rank int, r io.ReaderAt, n int64, spans []chunking.Span, progress func(int64)) (PutResult, error) {
	if tp < 2 || rank < 0 || rank >= tp {
		return PutResult{}, fmt.Errorf("rank layout: rank %d of tensor-parallel size %d: %w", rank, tp, ErrInvalidPath)
	}
	if _, err := s.FileManifest(src); err != nil {
		return PutResult{}, fmt.Errorf("rank layout of %s: %w", src, err)
	}
	name := rankLayoutName(tp, rank)
	im := s.NewImporter()
	defer im.Abort()
	var res PutResult
	var err error
	if spans != nil {
		res, err = im.PutSafetensorsSpans(ctx, r, n, name, spans, progress)
	} else {
		res, err = im.PutReader(ctx, r, n, name, progress)
	}
	if err != nil {
		return res, fmt.Errorf("rank layout: %w", err)
	}
	if err := im.Flush(); err != nil {
		return res, fmt.Errorf("rank layout: %w", err)
	}
	// The importer holds GC off until Close: the namespace names the
	// manifest before GC can look for what nothing names.
	err = s.Update(func(tx *NSTx) error {
		d, err := tx.dir([]string{LayoutDir, src.String()}, true, true)
		if err != nil {
			return err
		}
		if err := tx.dropOld(d, name); err != nil {
			return err
		}
		now := time.Now().UnixNano()
		d.m.Put(Entry{Name: name, Kind: KindFile, Mode: 0o644, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
			ID: res.ID, Size: n, MTime: now, CTime: now, HLC: tx.hlc})
		delete(d.children, name)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("rank layout: %w", err)
	}
	if err := im.Close(); err != nil {
		return res, err
	}
	s.madeHere.add(s, res.ID)
	return res, nil
}

// Layouts made on another member reach this one with the namespace merge,
// and a member holding the cluster key could publish a "layout" whose
// bytes are not its source's shares: every chunk of it would check
// against its id, and a load would still place wrong bytes. So a layout is
// used only where it was made, from the source's verified bytes: its id is
// then recorded in the data directory (rank-layouts.json). Making the
// layouts again on a member (kylix layout) records them there; identical
// layouts have the same ids, so nothing new is stored.
type layoutsMade struct {
	mu     sync.Mutex
	loaded bool
	ids    map[ID]bool
}

func layoutsMadePath(dir string) string { return filepath.Join(dir, "rank-layouts.json") }

// loadLocked reads the record once. A record that cannot be read trusts
// no layout (they are made again), which is the safe way to fail.
func (l *layoutsMade) loadLocked(s *Store) {
	if l.loaded {
		return
	}
	l.loaded, l.ids = true, map[ID]bool{}
	b, err := os.ReadFile(layoutsMadePath(s.dir))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var rec struct {
		Made []ID `json:"made"`
	}
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		s.log.Warn("rank layouts: the record of layouts made here cannot be read; none is used until made again (kylix layout)", "err", err)
		return
	}
	for _, id := range rec.Made {
		l.ids[id] = true
	}
}

// add records id as made here, and drops ids no longer stored.
func (l *layoutsMade) add(s *Store, id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loadLocked(s)
	l.ids[id] = true
	stored := map[ID]bool{}
	if ls, err := s.listRankLayouts(ID{}); err == nil {
		for _, x := range ls {
			stored[x.ID] = true
		}
		maps.DeleteFunc(l.ids, func(k ID, _ bool) bool { return !stored[k] })
	}
	rec := struct {
		Made []ID `json:"made"`
	}{slices.SortedFunc(maps.Keys(l.ids), func(a, b ID) int { return bytes.Compare(a[:], b[:]) })}
	b, err := json.Marshal(rec)
	if err == nil {
		tmp := layoutsMadePath(s.dir) + ".tmp"
		if err = os.WriteFile(tmp, b, filePerm); err == nil {
			err = os.Rename(tmp, layoutsMadePath(s.dir))
		}
	}
	if err != nil {
		s.log.Warn("rank layouts: recording a layout made here; it is used until the node restarts", "err", err)
	}
}

// RankLayoutMadeHere reports whether layout id was made on this member
// (from its source's verified bytes): only those are used.
func (s *Store) RankLayoutMadeHere(id ID) bool {
	s.madeHere.mu.Lock()
	defer s.madeHere.mu.Unlock()
	s.madeHere.loadLocked(s)
	return s.madeHere.ids[id]
}

// layoutDir returns the layout directory's manifest in the current
// namespace root, nil when there is none. Loads and GPU fills ask at every
// file they read with shares, so it is kept for the root it was read in
// (the root's manifest is decoded again only when the namespace changed).
// Callers must not change it.
func (s *Store) layoutDir() (*DirManifest, error) {
	root, _, err := s.Root()
	if err != nil {
		return nil, err
	}
	c := &s.layoutDirAt
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read && c.root == root {
		return c.dir, nil
	}
	rm, err := s.dirAt(root)
	if err != nil {
		return nil, err
	}
	d, err := s.reservedOf(rm, LayoutDir)
	if err != nil {
		return nil, err
	}
	c.root, c.dir, c.read = root, d, true
	return d, nil
}

// layoutDirCache is layoutDir's: the layout directory of one root.
type layoutDirCache struct {
	mu   sync.Mutex
	read bool
	root ID
	dir  *DirManifest
}

// RankLayouts lists the stored rank layouts of file version src (every
// source's when src is zero), by source, size and rank.
func (s *Store) RankLayouts(src ID) ([]RankLayout, error) {
	out, err := s.listRankLayouts(src)
	for i := range out {
		out[i].MadeHere = s.RankLayoutMadeHere(out[i].ID)
	}
	return out, err
}

// listRankLayouts is RankLayouts without MadeHere.
func (s *Store) listRankLayouts(src ID) ([]RankLayout, error) {
	ld, err := s.layoutDir()
	if err != nil || ld == nil {
		return nil, err
	}
	var out []RankLayout
	for _, e := range ld.Live() {
		id, err := ParseID(e.Name)
		if err != nil || e.Kind != KindDir || (src != ID{} && id != src) {
			continue
		}
		d, err := s.dirAt(e.ID)
		if err != nil {
			return nil, fmt.Errorf("rank layouts of %s: %w", e.Name, err)
		}
		for _, f := range d.Live() {
			tp, rank, ok := parseRankLayoutName(f.Name)
			if !ok || f.Kind != KindFile {
				continue
			}
			out = append(out, RankLayout{Source: id, TPSize: tp, Rank: rank, ID: f.ID, Bytes: f.Size})
		}
	}
	return out, nil
}

// OpenRankLayout opens rank's layout for tensor-parallel size tp of file
// version src; ErrNotFound when none is stored.
func (s *Store) OpenRankLayout(src ID, tp, rank int) (*File, error) {
	ls, err := s.RankLayouts(src)
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		if l.TPSize == tp && l.Rank == rank {
			return s.OpenFile(l.ID)
		}
	}
	return nil, fmt.Errorf("rank layout tp%d-rank%d of %s: %w", tp, rank, src, ErrNotFound)
}

// DropRankLayouts removes the rank layouts of file version src for
// tensor-parallel size tp (every size when tp is 0) and returns how many
// it removed. Their chunks are freed by the next GC.
func (s *Store) DropRankLayouts(src ID, tp int) (int, error) {
	n := 0
	err := s.Update(func(tx *NSTx) error {
		n = 0
		return tx.dropRankLayouts(func(id ID) bool { return id == src }, tp, &n)
	})
	return n, err
}

// dropRankLayouts removes the layouts of size tp (0: all) of the sources
// drop says yes to, a source's directory with its last layout.
func (tx *NSTx) dropRankLayouts(drop func(ID) bool, tp int, n *int) error {
	ld, err := tx.dir([]string{LayoutDir}, false, false)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ld.m.Live() {
		id, err := ParseID(e.Name)
		if err == nil && !drop(id) {
			continue
		}
		parts := []string{LayoutDir, e.Name}
		sub, err := tx.dir(parts, false, false)
		if err != nil {
			return err
		}
		left := 0
		for _, f := range sub.m.Live() {
			if size, _, ok := parseRankLayoutName(f.Name); ok && tp != 0 && size != tp {
				left++
				continue
			}
			if err := tx.remove(append(parts, f.Name), false, ""); err != nil {
				return err
			}
			*n++
		}
		if left == 0 {
			if err := tx.remove(parts, true, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// pruneRankLayoutsLocked removes the layouts whose source version no head
// reaches (their file was removed or written since), before GC marks. The
// caller holds gcMu and nsMu.
func (s *Store) pruneRankLayoutsLocked(ctx context.Context) (int, error) {
	ld, err := s.layoutDir()
	if err != nil || ld == nil || len(ld.Live()) == 0 {
		return 0, err
	}
	heads, err := s.Heads()
	if err != nil {
		return 0, err
	}
	live := map[ID]bool{}
	seen := map[ID]bool{}
	var walk func(id ID, root bool) error
	walk = func(id ID, root bool) error {
		if seen[id] {
			return nil
		}
		seen[id] = true
		if err := ctxErr(ctx); err != nil {
			return err
		}
		d, err := s.dirAt(id)
		if err != nil {
			return err
		}
		for _, e := range d.Entries {
			switch {
			case e.Deleted || (root && e.Name == LayoutDir):
			case e.Kind == KindFile:
				live[e.ID] = true
			case e.Kind == KindDir:
				if err := walk(e.ID, false); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, h := range heads {
		if err := walk(h.Root, true); err != nil {
			return 0, fmt.Errorf("rank layouts: reading head %q: %w", h.Name, err)
		}
	}
	n := 0
	err = s.updateLocked(func(tx *NSTx) error {
		n = 0
		return tx.dropRankLayouts(func(id ID) bool { return !live[id] }, 0, &n)
	})
	return n, err
}

// RankLayoutUsage counts the store's rank layouts: files, their bytes, and
// the bytes of their distinct chunks that their source files do not use
// (what the layouts added to the store, before packing).
func (s *Store) RankLayoutUsage() (files int, bytes, extra int64, err error) {
	ls, err := s.RankLayouts(ID{})
	if err != nil || len(ls) == 0 {
		return 0, 0, 0, err
	}
	seen := map[ID]bool{}
	src := map[ID]map[ID]bool{}
	for _, l := range ls {
		files++
		bytes += l.Bytes
		own, ok := src[l.Source]
		if !ok {
			own = map[ID]bool{}
			if m, err := s.FileManifest(l.Source); err == nil {
				for _, c := range m.Chunks {
					own[c.ID] = true
				}
			}
			src[l.Source] = own
		}
		m, err := s.FileManifest(l.ID)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("rank layout %s: %w", l.ID.Short(), err)
		}
		for _, c := range m.Chunks {
			if !own[c.ID] && !seen[c.ID] {
				seen[c.ID] = true
				extra += int64(c.Len)
			}
		}
	}
	return files, bytes, extra, nil
}

// PathRankLayouts is one file of RankLayoutsBelow (Stored) or
// DropRankLayoutsBelow (Dropped).
type PathRankLayouts struct {
	Path    string       `json:"path"`
	Stored  []RankLayout `json:"stored,omitempty"`
	Dropped int          `json:"dropped,omitempty"`
}

// RankLayoutsBelow lists the layouts of the files at or below path that
// have any (a content stored under several names, once).
func (s *Store) RankLayoutsBelow(ctx context.Context, path string) ([]PathRankLayouts, error) {
	return s.layoutsBelow(ctx, path, func(id ID) (PathRankLayouts, error) {
		ls, err := s.RankLayouts(id)
		return PathRankLayouts{Stored: ls}, err
	})
}

// DropRankLayoutsBelow removes the layouts of size tp (every size when 0)
// of the files at or below path, and lists the files that had some.
func (s *Store) DropRankLayoutsBelow(ctx context.Context, path string, tp int) ([]PathRankLayouts, error) {
	return s.layoutsBelow(ctx, path, func(id ID) (PathRankLayouts, error) {
		n, err := s.DropRankLayouts(id, tp)
		return PathRankLayouts{Dropped: n}, err
	})
}

func (s *Store) layoutsBelow(ctx context.Context, path string, fn func(ID) (PathRankLayouts, error)) ([]PathRankLayouts, error) {
	files, err := s.FilesBelow(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("rank layouts of %s: %w", path, err)
	}
	var out []PathRankLayouts
	for _, pf := range files {
		if pf.Again {
			continue // the same content as a file before: the same layouts
		}
		o, err := fn(pf.Entry.ID)
		if err != nil {
			return out, fmt.Errorf("rank layouts of %s: %w", pf.Path, err)
		}
		if len(o.Stored) > 0 || o.Dropped > 0 {
			o.Path = pf.Path
			out = append(out, o)
		}
	}
	return out, nil
}
