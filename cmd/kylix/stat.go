package main

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/node"
	"github.com/kylix/kylix/peers"
)

func init() {
	register(&command{name: "stat", summary: "show a path's size, chunks and on-disk extents", run: runStat})
}

type statOut struct {
	// Cluster: which alive members hold the file's chunks (cluster only).
	Cluster *peers.Replication `json:"cluster,omitempty"`
	Path    string             `json:"path"`
	Kind    string             `json:"kind"`
	Mode    string             `json:"mode"`
	Size    int64              `json:"size"`
	MTime   time.Time          `json:"mtime"`
	HLC     string             `json:"hlc"`
	// Device is a device node's major:minor.
	Device string              `json:"device,omitempty"`
	ID     string              `json:"id,omitempty"`
	Target string              `json:"target,omitempty"`
	Format string              `json:"format,omitempty"`
	Chunks []chunkOut          `json:"chunks,omitempty"`
	NChunk int                 `json:"chunk_count,omitempty"`
	Extent []chunkstore.Extent `json:"extents,omitempty"`
	// Contiguous: the whole file is one extent of one pack.
	Contiguous bool `json:"contiguous"`
	// WholeFilePack: a pack the index alone shows holding exactly this
	// file from offset 0 (one extent; the layout ioctl's whole-file flag).
	WholeFilePack string `json:"whole_file_pack,omitempty"`
	// PassthroughPack: the pack that holds exactly this file, also one
	// with its repeated chunks stored in place (then WholeFilePack is
	// empty): what FUSE passthrough and the client socket's PACKS hand
	// out, only after it passed its check; PassthroughCheck says what
	// checks the bytes a reader of this file gets. The text output names
	// it on the one "whole-file pack:" line.
	PassthroughPack  string `json:"passthrough_pack,omitempty"`
	PassthroughCheck string `json:"passthrough_check,omitempty"`
	// WholeCopy: PassthroughPack is a whole copy the node made of this
	// deduplicated file (docs/design/whole.md).
	WholeCopy bool `json:"whole_copy,omitempty"`
	// RankLayouts: the rank layouts stored for this file version (kylix
	// layout; docs/design/ranklayout.md).
	RankLayouts []chunkstore.RankLayout `json:"rank_layouts,omitempty"`
	Entries     int                     `json:"entries,omitempty"`
	// Pinned: held by a pin of the running node (docs/design/pin.md);
	// PinNote names the pin, or says why it is not held.
	Pinned  bool   `json:"pinned"`
	PinNote string `json:"pin_note,omitempty"`
	// PinGPU says whether the pinned memory is registered for GPU copies.
	PinGPU string `json:"pin_gpu,omitempty"`
	// ResidentBytes: the file's bytes in the page cache now.
	ResidentBytes int64 `json:"resident_bytes"`
	// LocalBytes: the file's bytes stored in this node's packs (files
	// only; a chunk repeated in the file counts each time).
	LocalBytes *int64 `json:"local_bytes,omitempty"`
	// PeerCacheBytes: of the rest, the bytes in this node's peer cache
	// (cluster only): readable here without asking a member, but
	// evictable, unlike the packs.
	PeerCacheBytes *int64 `json:"peer_cache_bytes,omitempty"`
}

type chunkOut struct {
	ID  string `json:"id"`
	Off int64  `json:"offset"`
	Len uint32 `json:"length"`
}

func runStat(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "stat", "[--data DIR] [--json] [--chunks] PATH", `
Shows a namespace path: size, mode, manifest ID; for files also the chunk
count, the extents on disk (backing pack file, offset, length), whether the
file is one contiguous extent, and whether a pack holds exactly the file (then
it can be served by FUSE passthrough and read directly by the GPU path).
For a file, its bytes stored in this node's packs; on a cluster member
also those in its peer cache (fetched lately, evictable), the copies
wanted, the fewest copies of one chunk, under-replicated bytes and which
members hold its chunks in their packs, as the alive members answer.`).withJSON()
	chunks := f.Bool("chunks", false, "list every chunk")
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	path := f.Arg(0)
	ent, err := s.Lookup(path)
	if err != nil {
		return err
	}
	out := statOut{Path: path, Kind: ent.Kind.String(), Mode: modeString(ent), Size: ent.Size,
		MTime: time.Unix(0, ent.MTime).UTC(), HLC: ent.HLC.String(), Target: ent.Target}
	// Only files and directories name an object; symlinks and special
	// files are metadata in their directory.
	if ent.Kind == chunkstore.KindFile || ent.Kind == chunkstore.KindDir {
		out.ID = ent.ID.String()
	}
	if ent.Kind.IsDevice() {
		out.Device = fmt.Sprintf("%d:%d", unix.Major(ent.Rdev), unix.Minor(ent.Rdev))
	}
	switch ent.Kind {
	case chunkstore.KindFile:
		file, err := s.OpenFile(ent.ID)
		if err != nil {
			return err
		}
		out.Format = file.M.Format.String()
		out.NChunk = len(file.M.Chunks)
		if *chunks {
			var off int64
			for _, c := range file.M.Chunks {
				out.Chunks = append(out.Chunks, chunkOut{ID: c.ID.String(), Off: off, Len: c.Len})
				off += int64(c.Len)
			}
		}
		out.Extent = file.Extents()
		out.Contiguous = len(out.Extent) <= 1 && (len(out.Extent) == 0 || out.Extent[0].Pack != 0)
		out.WholeFilePack, _ = file.WholeFilePack()
		out.PassthroughPack, out.PassthroughCheck = passthroughCheck(e.node, s, file)
		out.WholeCopy = file.WholeCopy()
		if out.RankLayouts, err = s.RankLayouts(file.ID); err != nil {
			return err
		}
		out.ResidentBytes = node.FileResident(file)
		var local int64
		var notLocal []chunkstore.ChunkRef
		for _, x := range out.Extent {
			if x.Pack != 0 {
				local += x.Len
			}
		}
		out.LocalBytes = &local
		if out.Cluster, err = clusterReplication(ctx, e, path); err != nil {
			return err
		}
		if member := e.node.Peers(); member != nil {
			plan, err := file.Plan(0, file.Size())
			if err != nil {
				return err
			}
			for _, pc := range plan.Missing() {
				notLocal = append(notLocal, chunkstore.ChunkRef{ID: pc.ID, Len: uint32(pc.Len)})
			}
			plan.Release()
			_, cached := member.PeerCached(notLocal)
			out.PeerCacheBytes = &cached
		}
	case chunkstore.KindDir:
		l, err := s.List(path)
		if err != nil {
			return err
		}
		out.Entries = len(l)
	}
	pins := e.pinView(s)
	out.Pinned, out.PinNote = pins.Info(path, ent)
	out.PinGPU = pins.GPU(path, ent)
	if f.jsonOut {
		return f.printJSON(out)
	}
	w := e.stdout
	fmt.Fprintf(w, "path:     %s\nkind:     %s\nmode:     %s\nsize:     %d (%s)\nmtime:    %s\nhlc:      %s\n",
		out.Path, out.Kind, out.Mode, out.Size, human(out.Size), out.MTime.Local().Format(time.RFC3339), out.HLC)
	if out.ID != "" {
		fmt.Fprintf(w, "id:       %s\n", out.ID)
	}
	if out.Target != "" {
		fmt.Fprintf(w, "target:   %s\n", out.Target)
	}
	if out.Device != "" {
		fmt.Fprintf(w, "device:   %s\n", out.Device)
	}
	if ent.Kind == chunkstore.KindDir {
		fmt.Fprintf(w, "entries:  %d\n", out.Entries)
	}
	printPinned(w, out.Pinned, out.PinNote, out.PinGPU)
	if ent.Kind != chunkstore.KindFile {
		return nil
	}
	fmt.Fprintf(w, "resident: %s of %s in memory (page cache)\n", human(out.ResidentBytes), human(out.Size))
	if out.PeerCacheBytes != nil {
		fmt.Fprintf(w, "here:     %s of %s in this node's packs, %s in its peer cache, %s only on other members\n",
			human(*out.LocalBytes), human(out.Size), human(*out.PeerCacheBytes), human(max(0, out.Size-*out.LocalBytes-*out.PeerCacheBytes)))
	} else {
		fmt.Fprintf(w, "here:     %s of %s in this node's packs\n", human(*out.LocalBytes), human(out.Size))
	}
	fmt.Fprintf(w, "format:   %s\nchunks:   %d\ncontiguous: %v\n", out.Format, out.NChunk, out.Contiguous)
	fmt.Fprintf(w, "whole-file pack: %s\n", wholeFilePackLine(out))
	fmt.Fprintf(w, "reads checked by: %s\n", out.PassthroughCheck)
	for _, l := range out.RankLayouts {
		fmt.Fprintf(w, "rank layout: tp%d-rank%d, %s (kylix layout)\n", l.TPSize, l.Rank, human(l.Bytes))
	}
	if out.Cluster != nil {
		printReplication(w, out.Cluster)
	}
	fmt.Fprintf(w, "extents:  %d\n", len(out.Extent))
	for _, x := range out.Extent {
		where := "not local"
		if x.Pack != 0 {
			where = fmt.Sprintf("%s @ %d", x.PackPath, x.PackOff)
		}
		fmt.Fprintf(w, "  [%d, %d) %s -> %s\n", x.FileOff, x.FileOff+x.Len, human(x.Len), where)
	}
	for _, c := range out.Chunks {
		fmt.Fprintf(w, "  chunk %s @ %d +%d\n", c.ID, c.Off, c.Len)
	}
	return nil
}

// wholeFilePackLine says, once, which pack holds exactly the file. The
// passthrough pack is the one passthrough and the client socket's PACKS use
// (chunkstore.File.PassthroughCandidate, after its check); the index may
// also point each chunk into it (WholeFilePack), or, for a file stored with
// its duplicates in place, point some chunks elsewhere (the pack still
// holds them, proven by the check).
func wholeFilePackLine(out statOut) string {
	switch {
	case out.PassthroughPack == "":
		return "none: the node serves every read (no passthrough)"
	case out.WholeCopy:
		return out.PassthroughPack + " (a whole copy of this deduplicated file, made for passthrough: its shared chunks stored a second time; docs/design/whole.md)"
	case out.WholeFilePack == "":
		return out.PassthroughPack + " (exactly the file, its repeated chunks stored in place; the index, and so the extents below, name their first copy)"
	}
	return out.PassthroughPack + " (exactly the file)"
}

// passthroughCheck returns the file's passthrough pack, if any, and what
// guarantee holds for reads of the file: in a running node (stat is then
// answered by it) what its record of checked packs says.
func passthroughCheck(n *node.Node, s *chunkstore.Store, f *chunkstore.File) (string, string) {
	const daemon = "the node: every chunk is hashed when it is read (no passthrough)"
	_, path, ok := f.PassthroughCandidate()
	if !ok {
		return "", daemon
	}
	if chunkstore.HasVerity(path) {
		return path, "fs-verity: the kernel checks every read (passthrough, mmap)"
	}
	rate := "the node's --scrub-rate"
	if n != nil {
		if r := n.FS().ScrubRate(); r > 0 {
			rate = human(r) + "/s"
		} else {
			rate = ""
		}
	}
	_, c, _ := s.PackState(f)
	switch {
	case c == nil && f.Size() > chunkstore.InlineCheckMax:
		return path, "the node, until the pack check finishes (not checked since the boot or since the pack changed: the next open is served by the node, every chunk hashed, while the pack is checked in the background; then passthrough)"
	case c == nil:
		return path, "passthrough after a check: not checked since the boot or since the pack changed; the next open hashes it whole first"
	case !c.OK():
		return path, "the node (every chunk hashed): the pack failed its check: " + c.Err().Error()
	case rate == "":
		return path, fmt.Sprintf("passthrough, verified at first open (%s); scrub off: a later flip on disk is caught at the next boot or change of the pack, not by every read", c.At.Format(time.RFC3339))
	}
	return path, fmt.Sprintf("passthrough, verified at first open (%s) + scrub at %s: a later flip on disk is caught by the scrub or the next change, not by every read", c.At.Format(time.RFC3339), rate)
}
