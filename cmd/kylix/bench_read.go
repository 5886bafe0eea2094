package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kylix/kylix/chunkstore/storeio"
)

func init() {
	register(&command{name: "bench-read", summary: "measure raw parallel read bandwidth of local files (the disk's limit)", run: runBenchRead})
}

func runBenchRead(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "bench-read", "[--direct] [--depth N] [--block SIZE] [--reader io_uring|pread] FILE...", `
Reads the given local files whole, with --depth reads of --block bytes in
flight, and prints the bandwidth: the limit kylix load is compared with. With
--direct (the default) the files are opened O_DIRECT, so the page cache is
bypassed; drop the page cache first for a cold figure anyway.`).withJSON()
	direct := f.Bool("direct", true, "open the files with O_DIRECT")
	depth := f.Int("depth", 32, "reads in flight")
	blockS := f.String("block", "4MiB", "size of each read")
	reader := f.String("reader", "io_uring", "io_uring or pread")
	if err := f.parse(args, 1, -1); err != nil {
		return err
	}
	block64, err := parseSize(*blockS)
	if err != nil || block64%storeio.BlockSize != 0 {
		return fmt.Errorf("bench-read: --block %q: want a multiple of 4 KiB", *blockS)
	}
	block := int(block64)
	var r storeio.Reader
	switch *reader {
	case "io_uring":
		r, err = storeio.NewUring(storeio.UringOptions{Depth: *depth})
	case "pread":
		r = storeio.NewPread(*depth)
	default:
		err = fmt.Errorf("want io_uring or pread")
	}
	if err != nil {
		return fmt.Errorf("bench-read: --reader %s: %w", *reader, err)
	}
	defer r.Close()
	type piece struct {
		fd  int
		off int64
	}
	var pieces []piece
	var total int64
	for _, name := range f.Args() {
		var fh *os.File
		if *direct {
			fh, err = storeio.OpenDirect(name)
		} else {
			fh, err = os.Open(name)
		}
		if err != nil {
			return fmt.Errorf("bench-read: %w", err)
		}
		defer fh.Close()
		st, err := fh.Stat()
		if err != nil {
			return err
		}
		for off := int64(0); off < st.Size(); off += int64(block) {
			pieces = append(pieces, piece{int(fh.Fd()), off})
		}
	}
	var next, read atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for range *depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := storeio.AlignedBuffer(block)
			for {
				i := next.Add(1) - 1
				if i >= int64(len(pieces)) {
					return
				}
				req := &storeio.Request{Fd: pieces[i].fd, Off: pieces[i].off, Buf: buf}
				if err := r.Read(ctx, []*storeio.Request{req}); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				read.Add(int64(req.N))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return fmt.Errorf("bench-read: %w", err)
	}
	total = read.Load()
	gbps := float64(total) / el.Seconds() / 1e9
	if f.jsonOut {
		return f.printJSON(map[string]any{"bytes": total, "seconds": el.Seconds(), "gb_per_s": gbps, "direct": *direct, "depth": *depth, "block": block, "reader": r.Name()})
	}
	fmt.Fprintf(e.stdout, "read %s in %.3fs = %.2f GB/s (%s, depth %d, %s blocks, direct %v)\n", human(total), el.Seconds(), gbps, r.Name(), *depth, human(int64(block)), *direct)
	return nil
}
