package chunkstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// Usage is what a subtree of the namespace takes (kylix du).
type Usage struct {
	Path string `json:"path"`
	// LogicalBytes: the sizes of the files added up, each name counted
	// (as du --apparent-size would).
	LogicalBytes int64 `json:"logical_bytes"`
	// UniqueBytes: the lengths of the distinct chunks the files use, each
	// chunk counted once within the subtree.
	UniqueBytes int64 `json:"unique_bytes"`
	// StoredBytes: the bytes of the packs that those chunks occupy, in
	// whole 4 KiB blocks (the unit packs are laid out in; a pack's last
	// block is counted up to the pack's end). Chunks shared with files
	// outside the subtree are counted, so removing the subtree frees at
	// most this much.
	StoredBytes int64 `json:"stored_bytes"`
	// NotLocalBytes: the distinct chunks' bytes not stored on this node
	// (in UniqueBytes, not in StoredBytes).
	NotLocalBytes int64 `json:"not_local_bytes,omitempty"`
	Files         int64 `json:"files"`
	Dirs          int64 `json:"dirs"`
	Chunks        int64 `json:"chunks"`
	Packs         int64 `json:"packs"`
}

// DiskUsage returns the usage of the subtree at path and, with children,
// of each entry directly below it (in name order; empty for a file).
func (s *Store) DiskUsage(ctx context.Context, path string, children bool) (Usage, []Usage, error) {
	e, err := s.Lookup(path)
	if err != nil {
		return Usage{}, nil, err
	}
	clean, _ := CleanPath(path)
	manifests := map[ID][]ChunkRef{} // file manifests read once
	type acc struct {
		u      Usage
		chunks map[ID]uint32
	}
	add := func(a *acc, p string) func(string, Entry) error {
		a.u.Path = p
		return func(_ string, c Entry) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			switch c.Kind {
			case KindDir:
				a.u.Dirs++
			case KindFile:
				a.u.Files++
				a.u.LogicalBytes += c.Size
				if c.ID.IsZero() {
					return nil
				}
				refs, ok := manifests[c.ID]
				if !ok {
					m, err := s.FileManifest(c.ID)
					if err != nil {
						return fmt.Errorf("du %s: %w", p, err)
					}
					refs = m.Chunks
					manifests[c.ID] = refs
				}
				for _, r := range refs {
					a.chunks[r.ID] = r.Len
				}
			}
			return nil
		}
	}
	total := &acc{chunks: map[ID]uint32{}}
	var kids []*acc
	if children && e.Kind == KindDir {
		d, err := s.dirAt(e.ID)
		if err != nil {
			return Usage{}, nil, fmt.Errorf("du %s: %w", path, err)
		}
		total.u.Path, total.u.Dirs = clean, 1
		for _, c := range d.Live() {
			k := &acc{chunks: map[ID]uint32{}}
			p := joinPath(clean, c.Name)
			if err := s.walk(p, c, add(k, p)); err != nil {
				return Usage{}, nil, err
			}
			kids = append(kids, k)
			total.u.Files += k.u.Files
			total.u.Dirs += k.u.Dirs
			total.u.LogicalBytes += k.u.LogicalBytes
			for id, n := range k.chunks {
				total.chunks[id] = n
			}
		}
	} else if err := s.walk(clean, e, add(total, clean)); err != nil {
		return Usage{}, nil, err
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		for _, a := range append([]*acc{total}, kids...) {
			if err := s.chunkUsage(tx, a.chunks, &a.u); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Usage{}, nil, fmt.Errorf("du %s: %w", path, err)
	}
	out := make([]Usage, len(kids))
	for i, k := range kids {
		out[i] = k.u
	}
	return total.u, out, nil
}

// chunkUsage fills u's chunk figures for a set of distinct chunks: their
// lengths, and the 4 KiB blocks of the packs they occupy (each block
// counted once, clipped at the pack's end).
func (s *Store) chunkUsage(tx *bolt.Tx, chunks map[ID]uint32, u *Usage) error {
	type span struct{ start, end int64 }
	byPack := map[uint64][]span{}
	b := tx.Bucket(bucketChunks)
	for id, n := range chunks {
		u.Chunks++
		u.UniqueBytes += int64(n)
		v := b.Get(id[:])
		if v == nil {
			u.NotLocalBytes += int64(n)
			continue
		}
		l, err := decodeLocation(v)
		if err != nil {
			return fmt.Errorf("chunk %s: %w", id.Short(), err)
		}
		byPack[l.Pack] = append(byPack[l.Pack], span{l.Off &^ (packAlign - 1), alignUp(l.Off + int64(l.Len))})
	}
	packs := tx.Bucket(bucketPacks)
	var key [8]byte
	for pack, spans := range byPack {
		u.Packs++
		size := int64(-1)
		binary.BigEndian.PutUint64(key[:], pack)
		if v := packs.Get(key[:]); v != nil {
			if pi, err := decodePackInfo(v); err == nil {
				size = pi.Size
			}
		}
		sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
		cur := spans[0]
		flush := func(sp span) {
			if size >= 0 {
				sp.end = min(sp.end, max(size, sp.start))
			}
			u.StoredBytes += sp.end - sp.start
		}
		for _, sp := range spans[1:] {
			if sp.start <= cur.end {
				cur.end = max(cur.end, sp.end)
				continue
			}
			flush(cur)
			cur = sp
		}
		flush(cur)
	}
	return nil
}
