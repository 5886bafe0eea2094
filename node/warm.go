package node

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers"
)

// WarmReply is what kylix warm reports.
type WarmReply struct {
	Path          string  `json:"path"`
	Files         int     `json:"files"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	GBps          float64 `json:"gb_per_s"`
	ResidentBytes int64   `json:"resident_bytes"`
	Verified      bool    `json:"verified"`
	// LocalBytes were read from this node's packs; FetchedBytes (of
	// FetchedChunks distinct chunks) were not stored here and came from
	// the cluster through the node's fetcher (peer cache, relay or
	// holders).
	LocalBytes    int64 `json:"local_bytes"`
	FetchedBytes  int64 `json:"fetched_bytes"`
	FetchedChunks int   `json:"fetched_chunks"`
	// PeerCachedBytes of FetchedBytes were in this node's peer cache
	// already when the warm began (the rest came over the network).
	PeerCachedBytes int64 `json:"peer_cached_bytes"`
}

// warmPiece is what one worker reads at a time: whole chunks, at least
// this many bytes (whole chunks are not kept in the store's chunk cache).
const warmPiece = 16 << 20

// Warm reads every chunk of the namespace path path from its pack, verified,
// so that the packs are in the page cache (kylix warm, with or without a
// node). With member (a cluster member) the chunks not stored here are fetched
// from the members into its peer cache. Progress goes to progress.
func Warm(ctx context.Context, s *chunkstore.Store, member *peers.Node, path string, progress Progress) (WarmReply, error) {
	clean, err := chunkstore.CleanPath(path)
	if err != nil {
		return WarmReply{}, fmt.Errorf("warm %s: %w", path, err)
	}
	var files []*chunkstore.File
	seen := map[chunkstore.ID]bool{}
	var total int64
	err = s.Walk(clean, func(p string, ent chunkstore.Entry) error {
		if ent.Kind != chunkstore.KindFile || seen[ent.ID] {
			return ctx.Err()
		}
		seen[ent.ID] = true
		file, err := s.OpenFile(ent.ID)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		files = append(files, file)
		total += file.Size()
		return ctx.Err()
	})
	if errors.Is(err, chunkstore.ErrNotFound) {
		return WarmReply{}, fmt.Errorf("warm %s: no such path in the namespace (kylix ls shows what is there)", ShownPath(clean))
	}
	if err != nil {
		return WarmReply{}, fmt.Errorf("warm %s: %w", ShownPath(clean), err)
	}
	// Runs of chunks stored here, in pieces of whole chunks of at least
	// warmPiece, read by one worker per core; the chunks not stored here
	// (once each), read through the node's fetcher by clusterInFlight
	// workers. Both read through the store, which verifies every chunk.
	type piece struct {
		f       *chunkstore.File
		off, n  int64
		fetched bool
		id      chunkstore.ID // fetched pieces: the chunk
	}
	var local, remote []piece
	fetching := map[chunkstore.ID]bool{}
	for _, file := range files {
		plan, err := file.Plan(0, file.Size())
		if err != nil {
			return WarmReply{}, fmt.Errorf("warm %s: %w", ShownPath(clean), err)
		}
		var start, end int64
		flush := func() {
			if end > start {
				local = append(local, piece{f: file, off: start, n: end - start})
			}
			start = end
		}
		for _, pc := range plan.Pieces {
			if !pc.Local() {
				flush()
				start, end = pc.FileOff+pc.Len, pc.FileOff+pc.Len
				if !fetching[pc.ID] {
					fetching[pc.ID] = true
					remote = append(remote, piece{f: file, off: pc.FileOff, n: pc.Len, fetched: true, id: pc.ID})
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
	var want int64 // the bytes to read: local runs and distinct fetched chunks
	for _, pc := range local {
		want += pc.n
	}
	for _, pc := range remote {
		want += pc.n
	}
	var cachedBefore int64
	if member != nil && len(remote) > 0 {
		refs := make([]chunkstore.ChunkRef, len(remote))
		for i, pc := range remote {
			refs[i] = chunkstore.ChunkRef{ID: pc.id, Len: uint32(pc.n)}
		}
		_, cachedBefore = member.PeerCached(refs)
	}
	label := "warm " + ShownPath(clean)
	t0 := time.Now()
	var (
		done, fetched atomic.Int64
		first         error
		mu            sync.Mutex // first, progress
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
					mu.Lock()
					l := label
					if len(remote) > 0 {
						l = fmt.Sprintf("%s (%s local, %s fetched)", label, human(d-fetched.Load()), human(fetched.Load()))
					}
					progress.report(l, d, want)
					mu.Unlock()
				}
			}()
		}
	}
	work(local, runtime.GOMAXPROCS(0))
	work(remote, clusterInFlight)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	if first != nil {
		return WarmReply{}, fmt.Errorf("warm %s: %w", ShownPath(clean), first)
	}
	el := time.Since(t0)
	out := WarmReply{Path: ShownPath(clean), Files: len(files), Bytes: total, Seconds: el.Seconds(), Verified: true,
		FetchedBytes: fetched.Load(), FetchedChunks: len(remote), PeerCachedBytes: cachedBefore}
	out.LocalBytes = done.Load() - out.FetchedBytes
	if el > 0 {
		out.GBps = float64(done.Load()) / el.Seconds() / 1e9
	}
	for _, file := range files {
		out.ResidentBytes += FileResident(file)
	}
	return out, nil
}
