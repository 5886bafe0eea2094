package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"

	"github.com/kylix/kylix/chunkstore/storeio"
)

// Problem is one thing Verify found wrong.
type Problem struct {
	Kind  string   `json:"kind"` // "chunk", "missing-chunk", "object", "pack"
	ID    string   `json:"id,omitempty"`
	Pack  string   `json:"pack,omitempty"`
	Err   string   `json:"error"`
	Paths []string `json:"paths,omitempty"` // namespace paths that lose data
}

// VerifyReport is the result of Verify.
type VerifyReport struct {
	Files  int   `json:"files"`
	Chunks int   `json:"chunks"`
	Bytes  int64 `json:"bytes"`
	// NotHere counts chunks missing here that other members of the
	// cluster hold: not problems. Verify itself reports every missing
	// chunk as a problem; a caller that asked the cluster (kylix verify
	// in a node) moves those held elsewhere here.
	NotHere  int       `json:"not_stored_here,omitempty"`
	Problems []Problem `json:"problems"`
}

// OK reports whether nothing was found wrong.
func (r *VerifyReport) OK() bool { return len(r.Problems) == 0 }

// Verify re-reads and re-hashes every chunk reachable from the namespace path
// (everything in the store for ""), checks every manifest on the way, and
// reports what is corrupt or missing with the paths it affects. Bad chunks
// are dropped from the read cache. progress gets bytes hashed and the total.
func (s *Store) Verify(ctx context.Context, path string, progress func(done, total int64)) (*VerifyReport, error) {
	rep := &VerifyReport{Problems: []Problem{}}
	users := map[ID][]string{} // chunk -> paths of files that use it
	seenFile := map[ID]bool{}
	seenDir := map[ID]bool{}
	root, err := s.Lookup(path)
	if err != nil {
		return nil, err
	}
	clean, _ := CleanPath(path)
	var walk func(p string, e Entry) error
	walk = func(p string, e Entry) error {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		switch e.Kind {
		case KindFile:
			rep.Files++
			m, err := s.FileManifest(e.ID)
			if err != nil {
				rep.Problems = append(rep.Problems, Problem{Kind: "object", ID: e.ID.String(), Err: err.Error(), Paths: []string{p}})
				return nil
			}
			for _, c := range m.Chunks {
				if len(users[c.ID]) < 8 && (len(users[c.ID]) == 0 || users[c.ID][len(users[c.ID])-1] != p) {
					users[c.ID] = append(users[c.ID], p)
				}
			}
			seenFile[e.ID] = true
		case KindDir:
			d, err := s.dirAt(e.ID)
			if err != nil {
				rep.Problems = append(rep.Problems, Problem{Kind: "object", ID: e.ID.String(), Err: err.Error(), Paths: []string{p}})
				return nil
			}
			seenDir[e.ID] = true
			for _, c := range d.Live() {
				if err := walk(joinPath(p, c.Name), c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(clean, root); err != nil {
		return nil, err
	}
	// Resolve locations; for the whole store also check chunks nothing uses.
	type item struct {
		id  ID
		loc Location
	}
	var items []item
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketChunks)
		if clean == "" {
			return b.ForEach(func(k, v []byte) error {
				var id ID
				copy(id[:], k)
				l, err := decodeLocation(v)
				if err != nil || len(k) != IDSize {
					rep.Problems = append(rep.Problems, Problem{Kind: "chunk", ID: fmt.Sprintf("%x", k), Err: fmt.Sprintf("bad index record: %v", err)})
					return nil
				}
				items = append(items, item{id, l})
				return nil
			})
		}
		for id := range users {
			v := b.Get(id[:])
			if v == nil {
				continue
			}
			l, err := decodeLocation(v)
			if err != nil {
				rep.Problems = append(rep.Problems, Problem{Kind: "chunk", ID: id.String(), Err: err.Error(), Paths: users[id]})
				continue
			}
			items = append(items, item{id, l})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	present := map[ID]bool{}
	for _, it := range items {
		present[it.id] = true
	}
	for id, ps := range users {
		if !present[id] {
			rep.Problems = append(rep.Problems, Problem{Kind: "missing-chunk", ID: id.String(), Err: "chunk is in a manifest but not in the store", Paths: ps})
		}
	}
	// Read in pack order, so each pack is read front to back.
	sort.Slice(items, func(i, j int) bool {
		if items[i].loc.Pack != items[j].loc.Pack {
			return items[i].loc.Pack < items[j].loc.Pack
		}
		return items[i].loc.Off < items[j].loc.Off
	})
	var total int64
	for _, it := range items {
		total += int64(it.loc.Len)
	}
	const batchBytes = 64 << 20
	var done int64
	for i := 0; i < len(items); {
		if err := ctxErr(ctx); err != nil {
			return nil, err
		}
		j, n := i, int64(0)
		for j < len(items) && (j == i || n+int64(items[j].loc.Len) <= batchBytes) {
			n += int64(items[j].loc.Len)
			j++
		}
		var reqs []*storeio.Request
		var idx []int
		leases := map[uint64]*Lease{}
		for k := i; k < j; k++ {
			it := items[k]
			ls, ok := leases[it.loc.Pack]
			if !ok {
				var err error
				if ls, err = s.packs.acquire(it.loc.Pack); err != nil {
					rep.Problems = append(rep.Problems, Problem{Kind: "chunk", ID: it.id.String(), Pack: s.PackPath(it.loc.Pack), Err: err.Error(), Paths: users[it.id]})
					continue
				}
				leases[it.loc.Pack] = ls
			}
			reqs = append(reqs, &storeio.Request{Fd: ls.Fd(), Off: it.loc.Off, Buf: make([]byte, it.loc.Len)})
			idx = append(idx, k)
		}
		s.io.Read(ctx, reqs) // per-request errors are examined below
		for _, ls := range leases {
			ls.Release()
		}
		refs := make([]ChunkRef, len(reqs))
		for k := range reqs {
			refs[k] = ChunkRef{ID: items[idx[k]].id, Len: items[idx[k]].loc.Len}
		}
		bad := hashCheck(refs, reqs)
		for k, rq := range reqs {
			it := items[idx[k]]
			var perr error
			switch {
			case rq.Err != nil:
				perr = rq.Err
			case rq.N != len(rq.Buf):
				perr = fmt.Errorf("pack holds %d of its %d bytes (truncated)", rq.N, len(rq.Buf))
			case bad[k]:
				perr = errors.New("hash mismatch: the bytes on disk are not the chunk's")
			}
			rep.Chunks++
			rep.Bytes += int64(it.loc.Len)
			if perr != nil {
				s.cache.remove(it.id)
				rep.Problems = append(rep.Problems, Problem{Kind: "chunk", ID: it.id.String(), Pack: fmt.Sprintf("%s@%d", s.PackPath(it.loc.Pack), it.loc.Off), Err: perr.Error(), Paths: users[it.id]})
			}
		}
		done += n
		if progress != nil {
			progress(done, total)
		}
		i = j
	}
	sort.Slice(rep.Problems, func(i, j int) bool {
		a, b := rep.Problems[i], rep.Problems[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.ID < b.ID
	})
	return rep, nil
}

// hashCheck returns, per request, whether its bytes fail to match the ID.
func hashCheck(refs []ChunkRef, reqs []*storeio.Request) []bool {
	bad := make([]bool, len(reqs))
	parallelFor(len(reqs), func(k int) {
		rq := reqs[k]
		if rq.Err == nil && rq.N == len(rq.Buf) && Sum(rq.Buf) != refs[k].ID {
			bad[k] = true
		}
	})
	return bad
}
