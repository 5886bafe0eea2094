package chunkstore

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// warmPiece is what one Warm worker reads at a time: whole chunks, at
// least this many bytes (reads of whole chunks are not kept in the chunk
// cache, so the bytes go from the page cache through the hash and away).
const warmPiece = 16 << 20

// WarmProgress is how far a Warm is: Done of Total bytes read and
// verified, Fetched of them brought by the Fetcher.
type WarmProgress struct {
	Done, Fetched, Total int64
}

// WarmOptions are Warm's callbacks; both may be nil.
type WarmOptions struct {
	// Fetching is called once, before anything is read, with the
	// distinct chunks not stored here that the warm will fetch (a cluster
	// member sees which its peer cache holds already). Not called when
	// there are none.
	Fetching func([]ChunkRef)
	// Progress is called after each piece read, one call at a time.
	Progress func(WarmProgress)
}

// WarmResult is what a Warm read.
type WarmResult struct {
	// Files are the file versions below the path, each once (a caller
	// asks the page cache how much of them is resident).
	Files []*File
	// Bytes is the size of Files; Read the bytes read and verified:
	// LocalBytes from this node's packs, FetchedBytes (of FetchedChunks
	// distinct chunks) through the Fetcher. A chunk two files share is
	// read once.
	Bytes         int64
	LocalBytes    int64
	FetchedBytes  int64
	FetchedChunks int
	// Duration is the time the reads took (planning not counted).
	Duration time.Duration
}

// Warm reads every chunk of the files at and below path, verifying each
// against its id, so that the packs holding them are in the page cache
// and later reads of them come from memory. The chunks stored here are
// read in runs of whole chunks of at least warmPiece bytes, one worker per
// core; the chunks not stored here are read once each through the
// Fetcher, makeLocalInFlight at once (on a cluster member its fetches
// land in the peer cache; alone they fail with ErrNotLocal). The first
// failure (a corrupt chunk, one no one can send) stops the rest. Errors
// for the path as FilesBelow's.
func (s *Store) Warm(ctx context.Context, path string, opts WarmOptions) (WarmResult, error) {
	var res WarmResult
	below, err := s.FilesBelow(ctx, path)
	if err != nil {
		return res, err
	}
	type piece struct {
		f       *File
		off, n  int64
		fetched bool
	}
	var local, remote []piece
	var refs []ChunkRef
	fetching := map[ID]bool{}
	for _, pf := range below {
		if pf.Again {
			continue
		}
		f, err := s.OpenFile(pf.Entry.ID)
		if err != nil {
			return res, err
		}
		res.Files = append(res.Files, f)
		res.Bytes += f.Size()
		plan, err := f.Plan(0, f.Size())
		if err != nil {
			return res, err
		}
		var start, end int64
		flush := func() {
			if end > start {
				local = append(local, piece{f: f, off: start, n: end - start})
			}
			start = end
		}
		for _, pc := range plan.Pieces {
			if !pc.Local() {
				flush()
				start, end = pc.FileOff+pc.Len, pc.FileOff+pc.Len
				if !fetching[pc.ID] {
					fetching[pc.ID] = true
					remote = append(remote, piece{f: f, off: pc.FileOff, n: pc.Len, fetched: true})
					refs = append(refs, ChunkRef{ID: pc.ID, Len: uint32(pc.Len)})
				}
				continue
			}
			end = pc.FileOff + pc.Len
			if end-start >= warmPiece {
				flush()
			}
		}
		flush()
		plan.Release()
	}
	var want int64
	for _, pc := range local {
		want += pc.n
	}
	for _, pc := range remote {
		want += pc.n
	}
	if len(refs) > 0 && opts.Fetching != nil {
		opts.Fetching(refs)
	}
	t0 := time.Now()
	var (
		done, fetched atomic.Int64
		first         error
		mu            sync.Mutex // first, opts.Progress
		wg            sync.WaitGroup
	)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := func(pieces []piece, workers int) {
		var next atomic.Int64
		for range min(len(pieces), workers) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var buf []byte
				for k := int(next.Add(1) - 1); k < len(pieces) && wctx.Err() == nil; k = int(next.Add(1) - 1) {
					pc := pieces[k]
					if int64(cap(buf)) < pc.n {
						buf = make([]byte, pc.n)
					}
					if _, err := pc.f.ReadAtContext(wctx, buf[:pc.n], pc.off); err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						cancel()
						return
					}
					d := done.Add(pc.n)
					if pc.fetched {
						fetched.Add(pc.n)
					}
					if opts.Progress != nil {
						mu.Lock()
						opts.Progress(WarmProgress{Done: d, Fetched: fetched.Load(), Total: want})
						mu.Unlock()
					}
				}
			}()
		}
	}
	work(local, runtime.GOMAXPROCS(0))
	work(remote, makeLocalInFlight)
	wg.Wait()
	res.Duration = time.Since(t0)
	if first == nil {
		first = ctxErr(ctx)
	}
	if first != nil {
		return res, first
	}
	res.FetchedBytes, res.FetchedChunks = fetched.Load(), len(remote)
	res.LocalBytes = done.Load() - res.FetchedBytes
	return res, nil
}
