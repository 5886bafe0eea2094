package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "load", summary: "load stored files (or a tensor-parallel share) into GPU memory", run: runLoad})
}

func runLoad(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "load", "[--data DIR] --device cuda:N|host [flags] PATH...", `
Loads stored files into device memory and reports bytes, seconds, GB/s and the
path the bytes took, per file. safetensors files are loaded tensor by tensor;
with --tp-size/--tp-rank only that rank's share of each tensor, by the rules
kylix.torch.load_file uses too (gpuio/tprules.go, as vLLM shards each layer):
column-parallel q/k/v/gate/up/w1/w3 weights and biases and embeddings split
along dim 0, row-parallel o/down/w2/out_proj/dense_4h_to_h weights along dim
1, tensors fused on disk, norms and everything else whole; an uneven
dimension is cut as torch.chunk cuts it. PATH is a namespace file or
directory. A row-parallel share is strided rows of its tensor, read as
most of the tensor; when 'kylix layout --tp-size N' stored a rank layout of
the file, the rank reads its shares from it as one run instead (the report
names it; --no-layout reads the file as it is).

Paths: auto (fastest available), gds (cuFile native/P2PDMA), gds-compat
(cuFile compatibility mode), bounce (reads into pinned buffers, async copies),
unified (integrated GPUs). Without --strict an unavailable path falls back to
bounce and the report says so; with --strict it is an error. --device host is
a host-memory test device (no GPU involved), never chosen automatically; the
memory one pass frees is reused by the next (--repeat), as GPU allocators do.

On a cluster member (kylix serve --listen), the chunks of PATH not stored
here are fetched from the members while the load runs, in the order it needs
them, read from the network straight into the pinned buffers and verified as
they arrive; the report says how many ("fetched" in io). A copy of each is kept on
this member, written behind the load into its peer cache (serve --peer-cache, default
8GiB, least recently used evicted; checked when read), so the next load here reads
them locally (the report's "local copy"). --no-keep keeps nothing. A disk slower than
the network skips what it cannot write (the report's "not kept"; kylix peers also
counts chunks the disk had no room for above the reserve), never the load.
To keep a model for good, kylix pin it.`).withJSON()
	devName := f.String("device", "cuda:0", "cuda:N, or host (a host-memory test device)")
	pathName := f.String("path", "auto", "auto, gds, gds-compat, bounce or unified")
	strict := f.Bool("strict", false, "fail instead of falling back to a slower path")
	ioMode := f.String("io", "auto", "storage reads: auto (cached data copied through pinned buffers; the rest through the page cache when the load fits half of the memory available, so a repeat is warm, else O_DIRECT), direct, buffered, or mapped (page cache registered with the GPU once: faster for repeated loads)")
	tpRank := f.Int("tp-rank", 0, "tensor-parallel rank")
	tpSize := f.Int("tp-size", 1, "tensor-parallel size")
	buffers := f.Int("buffers", 0, "pinned buffers (default 2 per core, 4..32)")
	bufMiB := f.Int("buffer-mib", 16, "size of each pinned buffer in MiB")
	noVerify := f.Bool("no-verify", false, "skip re-hashing chunks (the report says so)")
	verifyOn := f.String("verify-on", "auto", "where chunks are hashed: auto (the GPU when it can), cpu or device")
	check := f.Bool("check", false, "after loading, copy every byte back and compare with the store")
	repeat := f.Int("repeat", 1, "load everything this many times (reports each pass)")
	inflight := f.Int("files", 4, "files loaded at once (they share the pinned buffers)")
	reader := f.String("reader", "pread", "storage reader: pread (a pool as wide as the buffers) or io_uring (a ring of the load's own)")
	noLayout := f.Bool("no-layout", false, "read a rank's share from the file even when a rank layout is stored (kylix layout)")
	noKeep := f.Bool("no-keep", false, "on a cluster member, keep no copy of the chunks fetched from the members (by default they are kept in the peer cache, behind the load)")
	if err := f.parse(args, 1, -1); err != nil {
		return err
	}
	req := node.LoadRequest{Paths: f.Args(), Device: *devName, Path: *pathName, Strict: *strict, IO: *ioMode,
		TPRank: *tpRank, TPSize: *tpSize, Buffers: *buffers, BufMiB: *bufMiB, NoVerify: *noVerify,
		VerifyOn: *verifyOn, Check: *check, Repeat: *repeat, Files: *inflight, Reader: *reader, NoKeep: *noKeep, NoLayout: *noLayout}
	if *tpSize < 1 || *tpRank < 0 || *tpRank >= *tpSize {
		return fmt.Errorf("load: --tp-rank %d must be in [0, --tp-size %d)", *tpRank, *tpSize)
	}
	show := func(p node.LoadPass) error {
		rep := p.Report
		if f.jsonOut {
			return f.printJSON(rep)
		}
		fmt.Fprintf(e.stdout, "device %s, path %s (%s), tp %d/%d; %s\n", rep.Device, rep.Path, rep.Note, rep.TPRank, rep.TPSize, p.VerifyNote)
		if rep.CachePolicy != "" {
			fmt.Fprintf(e.stdout, "  %s\n", rep.CachePolicy)
		}
		for _, lf := range rep.Files {
			ver := "verified on " + lf.VerifyOn
			if !lf.Verified {
				ver = "NOT verified"
			}
			chk := ""
			if lf.Checked {
				chk = ", read back and compared"
			}
			if lf.RankLayout != "" {
				chk += "; rank layout " + lf.RankLayout
			}
			fmt.Fprintf(e.stdout, "  %-60s %10s %7.3fs %7.2f GB/s  %s, %s, %s%s\n", lf.Path, human(lf.Bytes), lf.Seconds, lf.GBps, lf.DataPath, lf.IO, ver, chk)
		}
		fmt.Fprintf(e.stdout, "total: %s in %.3fs = %.2f GB/s; CPU %.2fs (%.2f cores)\n", human(rep.Bytes), rep.Seconds, rep.GBps, rep.CPUSeconds, rep.CPUSeconds/max(rep.Seconds, 1e-9))
		if rep.FetchedChunks > 0 {
			fmt.Fprintf(e.stdout, "fetched: %d chunks (%s) not stored here, from the members during the load\n", rep.FetchedChunks, human(rep.Fetched))
		}
		if rep.LocalCopyChunks > 0 {
			fmt.Fprintf(e.stdout, "local copy: %d chunks (%s) read from this member's copy of chunks fetched before (the peer cache)\n", rep.LocalCopyChunks, human(rep.LocalCopy))
		}
		if rep.KeptChunks > 0 || rep.NotKept > 0 {
			fmt.Fprintf(e.stdout, "kept: %d chunks (%s) written behind the load into the peer cache; not kept: %d\n", rep.KeptChunks, human(rep.Kept), rep.NotKept)
		}
		return nil
	}
	var showErr error
	onPass := func(p node.LoadPass) {
		if err := show(p); err != nil && showErr == nil {
			showErr = err
		}
	}
	// A running node loads with its own CUDA context: this process opens
	// none (the report's CPU time is the node's).
	err := f.call(ctx, node.OpLoad, req, nil, func(ev node.Event) {
		var p node.LoadPass
		if len(ev.Data) > 0 && json.Unmarshal(ev.Data, &p) == nil {
			onPass(p)
		}
	})
	if errors.Is(err, node.ErrNoNode) {
		var s *chunkstore.Store
		if s, err = f.open(); err != nil {
			return err
		}
		defer s.Close()
		err = node.Load(ctx, s, req, onPass)
	}
	if err != nil {
		return err
	}
	return showErr
}
