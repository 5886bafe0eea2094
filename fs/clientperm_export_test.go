package fs

import (
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/kylix/kylix/chunkstore"
)

// PackReadersCheck brings f's pack-reader map level with the namespace
// and compares it with one built from nothing for the same root. It
// returns how many builds from nothing and incremental updates the map
// had had, and a description of any difference ("" if none).
func PackReadersCheck(f *FS) (builds, diffs int, diff string, err error) {
	r, err := f.packReadersNow(0)
	if err != nil {
		return 0, 0, "", err
	}
	defer r.mu.Unlock()
	builds, diffs = r.builds, r.diffs
	fresh := &packReaders{files: map[string]*permFile{}, byPack: map[uint64]map[string]struct{}{},
		spans: map[uint64][]span{}, stale: map[uint64]bool{}, covered: map[uint64]map[int64]bool{}}
	u := &permUpdate{f: f, r: fresh, infos: map[chunkstore.ID]*fileInfo{}}
	if err := u.addDir("", nil, r.root); err != nil {
		return builds, diffs, "", err
	}
	a, b := snapshotReaders(r), snapshotReaders(fresh)
	if !reflect.DeepEqual(a, b) {
		return builds, diffs, fmt.Sprintf("incremental %v\nfrom nothing %v", a, b), nil
	}
	return builds, diffs, "", nil
}

type readersSnap struct {
	Files map[string][]perm
	Packs map[uint64][]string
	Spans map[uint64][]span
}

func snapshotReaders(r *packReaders) readersSnap {
	s := readersSnap{Files: map[string][]perm{}, Packs: map[uint64][]string{}, Spans: map[uint64][]span{}}
	for p, pf := range r.files {
		s.Files[p] = pf.chain
	}
	for pk, ps := range r.byPack {
		s.Packs[pk] = slices.Sorted(maps.Keys(ps))
		s.Spans[pk] = slices.Clone(r.spansOf(pk))
	}
	return s
}
