package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "warm", summary: "read a path's chunks into the page cache, verified, with a progress bar", run: runWarm})
}

type warmOut struct {
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

func runWarm(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "warm", "[--data DIR] [--json] PATH", `
Reads every chunk of the namespace path PATH (a file, or a directory and
everything under it) from its pack, verifying each against its ID, so that
the packs are in the page cache: later loads and GPU fills of PATH read from
memory. Shows a progress bar on a terminal; reports the bytes read, the rate
and how much of PATH is resident afterwards (the kernel may evict pages
again under memory pressure; kylix pin keeps them). Works with and without
a running node. On a cluster member, the chunks not stored here are fetched
from the members (16 at a time, verified) into the node's peer cache, which
may evict them again (kylix pin keeps them); the report says how many bytes
came from the packs and how many were fetched. Exit status 1 if a chunk is
corrupt, or not stored here and no member can send it.`).withJSON()
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	clean, err := chunkstore.CleanPath(f.Arg(0))
	if err != nil {
		return fmt.Errorf("warm %s: %w", f.Arg(0), err)
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
		return fmt.Errorf("warm %s: no such path in the namespace (kylix ls shows what is there)", shownPath(clean))
	}
	if err != nil {
		return fmt.Errorf("warm %s: %w", shownPath(clean), err)
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
			return fmt.Errorf("warm %s: %w", shownPath(clean), err)
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
	if runningPeers != nil && len(remote) > 0 {
		refs := make([]chunkstore.ChunkRef, len(remote))
		for i, pc := range remote {
			refs[i] = chunkstore.ChunkRef{ID: pc.id, Len: uint32(pc.n)}
		}
		_, cachedBefore = runningPeers.PeerCached(refs)
	}
	label := "warm " + shownPath(clean)
	prog := newProgress(e, label)
	t0 := time.Now()
	var (
		done, fetched atomic.Int64
		first         error
		mu            sync.Mutex // first, prog
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
					if len(remote) > 0 {
						prog.label = fmt.Sprintf("%s (%s local, %s fetched)", label, human(d-fetched.Load()), human(fetched.Load()))
					}
					prog.update(d, want)
					mu.Unlock()
				}
			}()
		}
	}
	work(local, runtime.GOMAXPROCS(0))
	work(remote, clusterInFlight)
	wg.Wait()
	prog.finish()
	if first == nil {
		first = ctx.Err()
	}
	if first != nil {
		return fmt.Errorf("warm %s: %w", shownPath(clean), first)
	}
	el := time.Since(t0)
	out := warmOut{Path: shownPath(clean), Files: len(files), Bytes: total, Seconds: el.Seconds(), Verified: true,
		FetchedBytes: fetched.Load(), FetchedChunks: len(remote), PeerCachedBytes: cachedBefore}
	out.LocalBytes = done.Load() - out.FetchedBytes
	if el > 0 {
		out.GBps = float64(done.Load()) / el.Seconds() / 1e9
	}
	for _, file := range files {
		out.ResidentBytes += fileResident(file)
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	fetchedLine := ""
	if out.FetchedChunks > 0 {
		fetchedLine = fmt.Sprintf(": %s from this node's packs, %s (%d chunks) fetched from the members into the peer cache", human(out.LocalBytes), human(out.FetchedBytes), out.FetchedChunks)
		if out.PeerCachedBytes > 0 {
			fetchedLine += fmt.Sprintf(" (%s of it was there already)", human(out.PeerCachedBytes))
		}
	}
	fmt.Fprintf(e.stdout, "warmed %s: %d files, %s verified in %.2fs (%.2f GB/s)%s; %s resident in the page cache\n",
		out.Path, out.Files, human(out.Bytes), out.Seconds, out.GBps, fetchedLine, human(out.ResidentBytes))
	return nil
}
