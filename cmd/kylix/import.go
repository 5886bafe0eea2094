package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "import", summary: "store a file or directory tree under a namespace path", run: runImport})
}

func runImport(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "import", "[--data DIR] [--json] [--no-dereference] [--hf-cache [--hf-cache-dir DIR]] [--tp-size N] SRC DEST", `
Stores SRC (a file or a directory tree) in the store under the namespace path
DEST (for example models/tiny-llama), replacing what DEST named before. DEST
changes only when everything is stored: an interrupted import leaves it as it
was. safetensors files are cut at tensor boundaries, other files by content;
chunks already in the store are not written again. At the end it prints the
bytes written and the bytes found already stored (deduplicated).

A symlink that leads out of SRC to a regular file is followed: the file is
stored under the link's name. So a Hugging Face cache snapshot
(~/.cache/huggingface/hub/models--ORG--NAME/snapshots/REV), whose entries are
links into ../../blobs, imports as the model's files. Links inside SRC are
kept as links (a tree exported and imported again stays the same); links out
of SRC to directories, and dangling links, are kept too, with a note. Run as
root, a link out of SRC is followed only to a file of the link's own owner
(a user's link to a root-only file is kept as a link, with a note); a followed
file keeps its own owner and mode. --no-dereference keeps every link as a link.

With --hf-cache, SRC is a model id as on the Hugging Face Hub,
ORG/NAME[@REVISION] (a branch or tag, default main, or a commit hash), and
the model is imported from the local Hugging Face cache: --hf-cache-dir, else
$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.

With --tp-size N, rank layouts of the safetensors files are stored after the
import, as 'kylix layout --tp-size N DEST' stores them: each tensor-parallel
rank's shares back to back, which kylix load --tp-size and GPU fills then
read as one run (the last line says the bytes they added).`).withJSON()
	noDeref := f.Bool("no-dereference", false, "store symlinks as links instead of the files they name")
	hf := f.Bool("hf-cache", false, "SRC is a model id (ORG/NAME[@REVISION]) in the local Hugging Face cache")
	hfDir := f.String("hf-cache-dir", e.defaultHFHub(), "the Hugging Face hub cache, for --hf-cache")
	tp := f.Int("tp-size", 0, "then store rank layouts of the safetensors files for this tensor-parallel size (as kylix layout --tp-size does)")
	if err := f.parse(args, 2, 2); err != nil {
		return err
	}
	src, dest := f.Arg(0), f.Arg(1)
	if *hf {
		snap, err := hfSnapshot(*hfDir, src)
		if err != nil {
			return err
		}
		src = snap
	}
	// The node imports what this command names: relative to this
	// process's working directory, with this user's Hugging Face cache.
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	if *hf {
		src = abs
	}
	f.creates = true
	var rep node.ImportReply
	err = f.callProgress(ctx, node.OpImport, node.ImportRequest{Src: abs, Dest: dest, NoDereference: *noDeref, TPSize: *tp}, &rep)
	if errors.Is(err, node.ErrNoNode) { // no node: import here
		var s *chunkstore.Store
		if s, err = f.open(); err != nil {
			return err
		}
		defer s.Close()
		p := newProgress(e, "import")
		rep.Result, err = s.Import(ctx, src, dest, chunkstore.ImportOptions{Progress: p.update, NoDereference: *noDeref})
		p.finish()
		if err == nil && *tp > 1 {
			p = newProgress(e, "layout")
			rep.Layouts, rep.LayoutOthers, err = gpuio.MakeRankLayoutsBelow(ctx, s, dest, *tp, func(_ string, done, total int64) { p.update(done, total) })
			p.finish()
			if err != nil {
				err = fmt.Errorf("imported, but the rank layouts were not made: %w", err)
			}
		}
	}
	if err != nil {
		return err
	}
	res := rep.Result
	if rep.PushError != "" {
		fmt.Fprintf(e.stderr, "kylix import: imported, but not copied to the other members yet: %s (placement copies it later)\n", rep.PushError)
	}
	for _, m := range rep.PushFailed {
		fmt.Fprintf(e.stderr, "kylix import: imported, but not copied to member %s (its placement copies it later)\n", m)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(e.stderr, "kylix import: note: %s\n", n)
	}
	for _, n := range res.Skipped {
		fmt.Fprintf(e.stderr, "kylix import: skipped: %s\n", n)
	}
	if f.jsonOut {
		return f.printJSON(res)
	}
	pct := 0.0
	if res.Bytes > 0 {
		pct = 100 * float64(res.DedupBytes) / float64(res.Bytes)
	}
	fmt.Fprintf(e.stdout, "imported %s -> %s: %d files, %s\n", src, dest, res.Files, human(res.Bytes))
	if res.Followed > 0 || res.Symlinks > 0 {
		fmt.Fprintf(e.stdout, "  symlinks:     %d followed (stored as the files they name), %d kept as links\n", res.Followed, res.Symlinks)
	}
	fmt.Fprintf(e.stdout, "  new:          %s\n  deduplicated: %s (%.1f%%)\n  root:         %s\n", human(res.NewBytes), human(res.DedupBytes), pct, res.Root)
	if *tp > 1 {
		var n int
		var bytes, extra int64
		for _, l := range rep.Layouts {
			if l.Made != nil {
				n, bytes, extra = n+1, bytes+l.Made.Bytes, extra+l.Made.NewBytes
			}
		}
		fmt.Fprintf(e.stdout, "  rank layouts: tp %d for %d files, %s, new bytes stored %s (kylix layout)\n", *tp, n, human(bytes), human(extra))
	}
	return nil
}
