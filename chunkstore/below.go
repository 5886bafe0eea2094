package chunkstore

import (
	"context"
	"fmt"
	"sync"
)

// Operations on "the files at and below a path" (a file, or a directory
// and everything under it): what kylix pin, warm, evict, load and the
// cluster's placement ask of the store, walked in one place.

// noSuchPath is the error of the operations below for a path that is not
// in the namespace. It matches ErrNotFound.
type noSuchPath struct{}

func (noSuchPath) Error() string {
	return "no such path in the namespace (kylix ls shows what is there)"
}

func (noSuchPath) Is(target error) bool { return target == ErrNotFound }

// PathFile is one file at or below a path (FilesBelow).
type PathFile struct {
	Path  string // its namespace path
	Entry Entry  // Entry.ID is the file version, Entry.Size its size
	// Again: an earlier PathFile of the same walk is this version (a
	// deduplicated copy at another path). Callers that work on bytes or
	// chunks skip it; those that work on paths (a load) do not.
	Again bool
}

// FilesBelow lists the files at and below path, depth first in name
// order (Walk), every path once. A path not in the namespace is an error
// matching ErrNotFound that says "no such path in the namespace (kylix ls
// shows what is there)"; callers prefix their operation and the path. It
// honours ctx between entries.
func (s *Store) FilesBelow(ctx context.Context, path string) ([]PathFile, error) {
	var out []PathFile
	seen := map[ID]bool{}
	err := s.Walk(path, func(p string, e Entry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.Kind == KindFile {
			out = append(out, PathFile{Path: p, Entry: e, Again: seen[e.ID]})
			seen[e.ID] = true
		}
		return nil
	})
	if isLookupNotFound(err) {
		return nil, noSuchPath{}
	}
	return out, err
}

// isLookupNotFound: the walk's start was not found (the errors of the
// walk's own reads are wrapped by walk and name their path).
func isLookupNotFound(err error) bool {
	pe, ok := err.(*PathError)
	return ok && pe.Op == "lookup" && pe.Err == ErrNotFound
}

// ChunksBelow returns the distinct chunks of the files at and below path,
// each once, in the order the files (FilesBelow) and their manifests name
// them. It reads the manifests only: where the chunks are, or whether they
// are stored here, is not asked. Errors as FilesBelow's; a file whose
// manifest cannot be read fails naming its path.
func (s *Store) ChunksBelow(ctx context.Context, path string) ([]ChunkRef, error) {
	files, err := s.FilesBelow(ctx, path)
	if err != nil {
		return nil, err
	}
	var refs []ChunkRef
	seen := map[ID]bool{}
	for _, pf := range files {
		if pf.Again {
			continue
		}
		m, err := s.FileManifest(pf.Entry.ID)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pf.Path, err)
		}
		for _, c := range m.Chunks {
			if !seen[c.ID] {
				seen[c.ID] = true
				refs = append(refs, c)
			}
		}
	}
	return refs, nil
}

// MissingChunk is a chunk that is not stored here, with the first file
// (and the offset in it) found to need it.
type MissingChunk struct {
	ChunkRef
	Path    string // the file's namespace path ("" when not known)
	File    ID     // the file version
	FileOff int64
}

func (m MissingChunk) where() string {
	if m.Path != "" {
		return m.Path
	}
	return "file " + m.File.Short()
}

// MissingBelow lists, each once, the chunks of the files at and below
// path that are not stored in this node's packs (planned through the
// chunk-access seam: a chunk whose pack is gone counts as missing), and
// their bytes. Errors as FilesBelow's.
func (s *Store) MissingBelow(ctx context.Context, path string) ([]MissingChunk, int64, error) {
	files, err := s.FilesBelow(ctx, path)
	if err != nil {
		return nil, 0, err
	}
	var miss []MissingChunk
	var bytes int64
	seen := map[ID]bool{}
	for _, pf := range files {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		if pf.Again {
			continue
		}
		f, err := s.OpenFile(pf.Entry.ID)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", pf.Path, err)
		}
		m, err := f.missing(pf.Path, 0, f.Size(), seen)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", pf.Path, err)
		}
		for _, c := range m {
			bytes += int64(c.Len)
		}
		miss = append(miss, m...)
	}
	return miss, bytes, nil
}

// missing lists the chunks of [off, off+n) of f not stored here and not in
// seen, adding them to seen.
func (f *File) missing(path string, off, n int64, seen map[ID]bool) ([]MissingChunk, error) {
	p, err := f.Plan(off, n)
	if err != nil {
		return nil, err
	}
	defer p.Release()
	var out []MissingChunk
	for _, pc := range p.Missing() {
		if !seen[pc.ID] {
			seen[pc.ID] = true
			out = append(out, MissingChunk{ChunkRef: ChunkRef{ID: pc.ID, Len: uint32(pc.Len)}, Path: path, File: f.ID, FileOff: pc.FileOff})
		}
	}
	return out, nil
}

// StoreFetcher is a Fetcher that can also bring a chunk for a caller that
// writes it into this node's packs (MakeLocal), so that the fetcher need
// not keep a copy of its own (peers.Node keeps what Fetch brings in its
// peer cache). It need not verify the bytes: the packs' importer does.
type StoreFetcher interface {
	Fetcher
	// FetchToStore returns the n bytes of chunk id, or an error wrapping
	// ErrNotLocal when no one has it. It must honour ctx.
	FetchToStore(ctx context.Context, id ID, n uint32) ([]byte, error)
}

// makeLocalInFlight bounds the chunks MakeLocal and Warm ask the Fetcher
// for at once (kylix pin and warm say "16 at a time").
const makeLocalInFlight = 16

// makeLocalFlush: MakeLocal commits what arrived every this many bytes, so
// that a long fetch that fails late keeps most of its work.
const makeLocalFlush = flushPendingBytes

// MakeLocalResult is what MakeLocal stored.
type MakeLocalResult struct {
	Chunks int   // chunks written into the packs
	Bytes  int64 // their bytes
}

// MakeLocal brings the chunks miss (from MissingBelow, or a file's range:
// File.MakeLocal) through the store's Fetcher, makeLocalInFlight at once
// (FetchToStore when the Fetcher is a StoreFetcher), checks each against
// its id and writes it into the shared packs; what arrived is committed
// as it goes and before MakeLocal returns, even when a chunk fails. The
// first chunk that cannot be brought (ErrNotLocal: no one has it; always
// on a store alone) stops the rest and fails the whole, naming the file
// and offset that needs it. progress, when not nil, is called after each
// chunk stored with the bytes stored so far and the bytes of miss, one
// call at a time. Files opened before do not see the new locations: open
// them again.
func (s *Store) MakeLocal(ctx context.Context, miss []MissingChunk, progress func(done, total int64)) (MakeLocalResult, error) {
	var res MakeLocalResult
	if len(miss) == 0 {
		return res, nil
	}
	var total int64
	for _, m := range miss {
		total += int64(m.Len)
	}
	fetch := func(ctx context.Context, r ChunkRef) ([]byte, error) { return s.fetch(ctx, r, Location{}) }
	if sf, ok := s.fetcher.(StoreFetcher); ok {
		fetch = func(ctx context.Context, r ChunkRef) ([]byte, error) {
			data, err := sf.FetchToStore(ctx, r.ID, r.Len)
			if err == nil && uint32(len(data)) != r.Len {
				err = &CorruptError{Chunk: r.ID, Reason: fmt.Sprintf("fetched %d bytes, want %d", len(data), r.Len)}
			}
			return data, err
		}
	}
	im := s.NewImporter()
	var mu sync.Mutex // im, res, progress
	first := eachBounded(ctx, len(miss), makeLocalInFlight, func(ctx context.Context, i int) error {
		m := miss[i]
		data, err := fetch(ctx, m.ChunkRef)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s: the chunk at offset %d (%d bytes, %s) could not be fetched: %w", m.where(), m.FileOff, m.Len, m.ID.Short(), err)
		}
		if err := im.PutChunk(m.ID, data); err != nil {
			return fmt.Errorf("%s: storing the chunk at offset %d here: %w", m.where(), m.FileOff, err)
		}
		res.Chunks++
		res.Bytes += int64(len(data))
		if im.PendingBytes() >= makeLocalFlush {
			if err := im.Flush(); err != nil {
				return fmt.Errorf("committing fetched chunks: %w", err)
			}
		}
		if progress != nil {
			progress(res.Bytes, total)
		}
		return nil
	})
	if err := im.Close(); err != nil && first == nil {
		first = fmt.Errorf("committing fetched chunks: %w", err)
	}
	if first != nil {
		return res, fmt.Errorf("make local: %d of %d chunks stored: %w", res.Chunks, len(miss), first)
	}
	return res, nil
}

// MakeLocal stores here every chunk of [off, off+n) of f that is not
// stored here (Store.MakeLocal). It returns the number of chunks stored.
// f's own locations are not updated: open the file again to see the new
// ones. A chunk the Fetcher cannot bring fails with ErrNotLocal (always,
// alone: LocalOnly).
func (f *File) MakeLocal(ctx context.Context, off, n int64) (int, error) {
	miss, err := f.missing("", off, n, map[ID]bool{})
	if err != nil {
		return 0, err
	}
	res, err := f.s.MakeLocal(ctx, miss, nil) // its errors name the file
	return res.Chunks, err
}
