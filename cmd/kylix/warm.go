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
a running node. Exit status 1 if a chunk is corrupt or not stored here.`).withJSON()
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
	// Pieces of whole chunks, read by one worker per core.
	type piece struct {
		f      *chunkstore.File
		off, n int64
	}
	var pieces []piece
	for _, file := range files {
		var off, start int64
		for _, c := range file.M.Chunks {
			off += int64(c.Len)
			if off-start >= warmPiece {
				pieces = append(pieces, piece{file, start, off - start})
				start = off
			}
		}
		if off > start {
			pieces = append(pieces, piece{file, start, off - start})
		}
	}
	prog := newProgress(e, "warm "+shownPath(clean))
	t0 := time.Now()
	var (
		done  atomic.Int64
		next  atomic.Int64
		first error
		mu    sync.Mutex
		wg    sync.WaitGroup
	)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(len(pieces), runtime.GOMAXPROCS(0)) {
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
				mu.Lock()
				prog.update(d, total)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	prog.finish()
	if first == nil {
		first = ctx.Err()
	}
	if first != nil {
		return fmt.Errorf("warm %s: %w", shownPath(clean), first)
	}
	el := time.Since(t0)
	out := warmOut{Path: shownPath(clean), Files: len(files), Bytes: total, Seconds: el.Seconds(), Verified: true}
	if el > 0 {
		out.GBps = float64(total) / el.Seconds() / 1e9
	}
	for _, file := range files {
		out.ResidentBytes += fileResident(file)
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	fmt.Fprintf(e.stdout, "warmed %s: %d files, %s verified in %.2fs (%.2f GB/s); %s resident in the page cache\n",
		out.Path, out.Files, human(out.Bytes), out.Seconds, out.GBps, human(out.ResidentBytes))
	return nil
}
