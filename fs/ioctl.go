package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/fs/layout"
)

// Ioctl answers the layout ioctls (package layout, docs/design/ioctl.md).
// A command of another type than 'K', or an nr Kylix does not define, is
// ENOTTY; a known nr with the wrong direction or size, or a malformed
// request, is EINVAL; every command but PROBE on an fd not open for
// reading is EBADF (readable).
func (n *fileNode) Ioctl(ctx context.Context, fh gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	c := layout.DecodeCmd(cmd)
	if c.Type != 'K' {
		return 0, syscall.ENOTTY
	}
	if c.Nr == layout.NrProbe {
		return 0, n.fsys.ioctlProbe(cmd, output)
	}
	if c.Nr >= layout.NrLayout && c.Nr <= layout.NrMakeLocal && !readable(fh) {
		// Chunk ids, extents and pack paths tell what a file holds (a
		// guessed content can be confirmed by its ids): they are for an
		// fd that may read the file, as read(2) is.
		return 0, syscall.EBADF
	}
	switch c.Nr {
	case layout.NrLayout:
		if cmd != layout.CmdLayout {
			return 0, syscall.EINVAL
		}
		return 0, n.ioctlLayout(input, output)
	case layout.NrPackPath:
		if cmd != layout.CmdPackPath {
			return 0, syscall.EINVAL
		}
		return 0, n.ioctlPackPath(input, output)
	case layout.NrChunks:
		if !c.Read || !c.Write || len(input) != int(c.Size) || len(output) != int(c.Size) {
			return 0, syscall.EINVAL
		}
		return 0, n.ioctlChunks(c.Size, input, output)
	case layout.NrPack:
		if cmd != layout.CmdPack || len(input) != layout.PackSize || len(output) != layout.PackSize {
			return 0, syscall.EINVAL
		}
		return 0, n.ioctlPack(input, output)
	case layout.NrMakeLocal:
		if cmd != layout.CmdMakeLocal || len(input) != layout.MakeLocalSize {
			return 0, syscall.EINVAL
		}
		return 0, n.ioctlMakeLocal(ctx, input)
	}
	return 0, syscall.ENOTTY
}

// readable reports whether fh was opened for reading (O_RDONLY or O_RDWR).
// It is the one rule for the layout ioctls that describe a file's content
// (every one but PROBE): the kernel checked read permission at the open
// only for such an fd, so an O_WRONLY fd, which a user may hold on a file
// it may write but not read, is refused with EBADF (what read(2) answers
// on it).
func readable(fh gofs.FileHandle) bool {
	switch h := fh.(type) {
	case *handle:
		return h.read
	case *ptHandle:
		return true // passthrough opens are read-only
	}
	return false
}

// Ioctl answers KYLIX_IOC_PROBE on directories too, so that a library can
// ask about a mount before it opens a file. Every other command is ENOTTY.
func (n *dirNode) Ioctl(ctx context.Context, fh gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	if c := layout.DecodeCmd(cmd); c.Type == 'K' && c.Nr == layout.NrProbe {
		return 0, n.fsys.ioctlProbe(cmd, output)
	}
	return 0, syscall.ENOTTY
}

var (
	_ = (gofs.NodeIoctler)((*dirNode)(nil))

	warnSocketOnce sync.Once
)

// ioctlProbe answers KYLIX_IOC_PROBE: the magic, the highest layout
// version served, the node's pid and its client socket. It needs no
// committed version, so it answers files being written as well.
func (f *FS) ioctlProbe(cmd uint32, output []byte) syscall.Errno {
	if cmd != layout.CmdProbe || len(output) != layout.ProbeSize {
		return syscall.EINVAL
	}
	p := layout.Probe{Version: layout.Version2, NodePID: uint64(os.Getpid()), ClientSocket: f.opts.ClientSocket}
	if len(p.ClientSocket) >= layout.ClientSocketMax || !filepath.IsAbs(p.ClientSocket) {
		// The probe still says "Kylix"; a library then reads through the
		// mount. New is not ours to fail, so warn here.
		if p.ClientSocket != "" {
			warnSocketOnce.Do(func() {
				f.log.Warn("client socket path not served by KYLIX_IOC_PROBE: it must be absolute and shorter than the probe's field",
					"path", p.ClientSocket, "max", layout.ClientSocketMax-1)
			})
		}
		p.ClientSocket = ""
	}
	if layout.EncodeProbe(output, p) != nil {
		return syscall.EINVAL
	}
	return 0
}

// packTable is a file's pack table for KYLIX_IOC_CHUNKS and KYLIX_IOC_PACK:
// the distinct packs its index locations name, in file order of their
// first chunk. It depends only on the committed version (its manifest and
// the index locations read when it was opened), so indexes stay valid
// across calls while the version does, even if a pack goes missing in
// between.
func packTable(sf *chunkstore.File) []uint64 {
	var tab []uint64
	seen := map[uint64]bool{}
	for _, x := range sf.Extents() {
		if x.Pack != 0 && !seen[x.Pack] {
			seen[x.Pack] = true
			tab = append(tab, x.Pack)
		}
	}
	return tab
}

// ioctlChunks answers KYLIX_IOC_CHUNKS: the totals, then up to
// max_entries chunks from first_chunk, planned through the chunk-access
// seam (a chunk whose pack is not on disk is reported as not local). The
// leases are released on return: the answer is a snapshot, and a reader
// that uses it checks each chunk's id (and the pack's generation) and
// falls back to the mount.
func (n *fileNode) ioctlChunks(size uint32, input, output []byte) syscall.Errno {
	req, err := layout.DecodeChunksRequest(input, size)
	if err != nil {
		return syscall.EINVAL
	}
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	chunks := sf.M.Chunks
	nc := uint64(len(chunks))
	if req.FirstChunk > nc {
		return syscall.EINVAL
	}
	rep := layout.ChunksReply{NChunks: nc, FileSize: uint64(sf.Size()), FileID: sf.ID}
	last := min(nc, req.FirstChunk+uint64(req.MaxEntries))
	if last > req.FirstChunk {
		off, end := sf.ChunkOffset(int(req.FirstChunk)), sf.ChunkOffset(int(last))
		plan, err := sf.Plan(off, end-off)
		if err != nil {
			return toErrno(err)
		}
		defer plan.Release()
		if uint64(len(plan.Pieces)) != last-req.FirstChunk {
			n.fsys.log.Error("KYLIX_IOC_CHUNKS: plan and manifest disagree", "file", sf.ID.Short(),
				"chunks", last-req.FirstChunk, "pieces", len(plan.Pieces))
			return syscall.EIO
		}
		index := map[uint64]uint32{}
		for i, p := range packTable(sf) {
			index[p] = uint32(i)
		}
		for _, pc := range plan.Pieces {
			c := layout.Chunk{FileOffset: uint64(pc.FileOff), Length: uint32(pc.Len), PackIndex: layout.NoPack, ID: pc.ID}
			if pc.Local() {
				pi, ok := index[pc.Pack]
				if !ok {
					return syscall.EIO // the plan names a pack the table lacks: cannot happen for one version
				}
				c.Flags, c.PackIndex, c.PackOffset = layout.ChunkLocal, pi, uint64(pc.PackOff)
			}
			rep.Entries = append(rep.Entries, c)
		}
	}
	copy(output, input)
	if layout.EncodeChunksReply(output, rep) != nil {
		return syscall.EINVAL
	}
	return 0
}

// ioctlPack answers KYLIX_IOC_PACK: entry pack_index of the file's pack
// table. The pack is leased while it is looked at, so the path exists when
// the answer is made; the generation is computed from a stat of that path,
// the file a bypassing reader will open. PackChecked is set only when the
// store's passthrough pack check recorded exactly this state of the file
// (same device, inode, size, mtime and ctime).
func (n *fileNode) ioctlPack(input, output []byte) syscall.Errno {
	idx, err := layout.DecodePackRequest(input)
	if err != nil {
		return syscall.EINVAL
	}
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	tab := packTable(sf)
	if uint64(idx) >= uint64(len(tab)) {
		return syscall.EINVAL
	}
	id := tab[idx]
	ls, err := n.fsys.s.Lease(id)
	if err != nil {
		if errors.Is(err, chunkstore.ErrNotLocal) {
			return syscall.ENOENT // gone since the chunks were listed: read through the mount
		}
		return toErrno(err)
	}
	defer ls.Release()
	path := ls.Path()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return syscall.ENOENT
		}
		return syscall.EIO
	}
	ident := chunkstore.PackIdentity{Dev: st.Dev, Ino: st.Ino, Size: st.Size, MTime: st.Mtim.Nano(), CTime: st.Ctim.Nano()}
	p := layout.PackInfo{NPacks: uint32(len(tab)), Size: uint64(st.Size), Path: path,
		Generation: layout.Generation(ident.Dev, ident.Ino, ident.Size, ident.MTime, ident.CTime)}
	if _, whole := sf.WholeFilePack(); whole && len(tab) == 1 {
		p.Flags |= layout.PackWholeFile
	}
	if cand, check, ok := n.fsys.s.PackState(sf); ok && cand == id && check != nil && check.OK() && check.Identity == ident {
		// The check hashed this very state of the pack against the
		// file's manifest from offset 0, and the pack is exclusive and of
		// the file's size: it holds exactly the file.
		p.Flags |= layout.PackChecked | layout.PackWholeFile
	}
	copy(output, input)
	if layout.EncodePackReply(output, p) != nil {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// clipRange returns the end of the range [off, off+length) of a file of
// size bytes, clipped to the file (length 0: to the end), and false when off
// is past the end. Both layout ioctls take ranges this way.
func clipRange(off, length, size uint64) (uint64, bool) {
	if off > size {
		return 0, false
	}
	if length == 0 || length > size-off {
		return size, true
	}
	return off + length, true
}

// ioctlMakeLocal answers KYLIX_IOC_MAKE_LOCAL: 0 when every chunk of the
// range is stored here. Missing chunks are brought by the store's Fetcher
// (the cluster, docs/design/peers.md), verified and stored; one that
// cannot be brought (always, on a node alone) is EIO, logged with the
// chunk and the file. Before fetching, the file's path goes to
// Options.KeepLocal (a cluster member records it so that rebalance keeps
// what is stored).
func (n *fileNode) ioctlMakeLocal(ctx context.Context, input []byte) syscall.Errno {
	req, err := layout.DecodeMakeLocal(input)
	if err != nil {
		return syscall.EINVAL
	}
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	end, ok := clipRange(req.Offset, req.Length, uint64(sf.Size()))
	if !ok {
		return syscall.EINVAL
	}
	plan, err := sf.Plan(int64(req.Offset), int64(end-req.Offset))
	if err != nil {
		return toErrno(err)
	}
	miss := plan.Missing()
	plan.Release()
	if len(miss) == 0 {
		return 0
	}
	if keep := n.fsys.opts.KeepLocal; keep != nil {
		n.fsys.nsMu.RLock()
		p, ok := n.path()
		n.fsys.nsMu.RUnlock()
		if ok {
			if err := keep(p); err != nil {
				n.fsys.log.Warn("KYLIX_IOC_MAKE_LOCAL: cannot record the file as kept here", "path", p, "err", err)
				return syscall.EIO
			}
		}
	}
	if _, err := sf.MakeLocal(ctx, int64(req.Offset), int64(end-req.Offset)); err != nil {
		n.fsys.log.Warn("KYLIX_IOC_MAKE_LOCAL: chunks are not stored here and could not be fetched",
			"file", sf.ID.Short(), "missing", len(miss), "first", miss[0].ID.Short(), "file_offset", miss[0].FileOff, "err", err)
		return syscall.EIO
	}
	// The open file's locations predate the new chunks: open it again.
	n.mu.Lock()
	if st := n.state(); st != nil && st.file == sf {
		st.file = nil
	}
	n.mu.Unlock()
	return 0
}

func (n *fileNode) ioctlLayout(input, output []byte) syscall.Errno {
	if len(output) != layout.LayoutSize {
		return syscall.EINVAL
	}
	req, err := layout.DecodeRequest(input)
	if err != nil {
		return syscall.EINVAL
	}
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	size := uint64(sf.Size())
	end, ok := clipRange(req.Offset, req.Length, size)
	if !ok {
		return syscall.EINVAL
	}
	_, whole := sf.WholeFilePack()
	rep := layout.Reply{FileSize: size, NextOffset: end, FileID: sf.ID}
	exts, err := planExtents(sf, int64(req.Offset), int64(end))
	if err != nil {
		return toErrno(err)
	}
	for _, x := range exts {
		if len(rep.Extents) == layout.MaxExtents {
			rep.NextOffset = x.FileOffset
			break
		}
		if x.Flags&layout.ExtentLocal != 0 && whole {
			x.Flags |= layout.ExtentWholeFile
		}
		rep.Extents = append(rep.Extents, x)
	}
	copy(output, input)
	if err := layout.EncodeReply(output, rep); err != nil {
		return syscall.EINVAL
	}
	return 0
}

func (n *fileNode) ioctlPackPath(input, output []byte) syscall.Errno {
	if len(output) != layout.PackPathSize {
		return syscall.EINVAL
	}
	id, err := layout.DecodePackPathRequest(input)
	if err != nil {
		return syscall.EINVAL
	}
	// Only packs that hold part of this file: the ioctl does not reveal
	// the rest of the store.
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	plan, err := sf.Plan(0, sf.Size())
	if err != nil {
		return toErrno(err)
	}
	defer plan.Release()
	for _, pc := range plan.Pieces {
		if pc.Local() && pc.Pack == id {
			copy(output, input)
			if layout.EncodePackPathReply(output, pc.Lease.Path()) != nil {
				return syscall.EINVAL
			}
			return 0
		}
	}
	return syscall.EINVAL
}

// planExtents plans [off, end) of sf through the chunk-access seam and
// merges its pieces into extents: runs of chunks back to back in one pack,
// or runs of chunks not stored here. A chunk whose pack is missing from
// disk is reported as not local. The plan's leases are released on return:
// the layout is a snapshot, and a bypass reader that uses it verifies the
// chunks it reads (and falls back to the mount on a failure).
func planExtents(sf *chunkstore.File, off, end int64) ([]layout.Extent, error) {
	plan, err := sf.Plan(off, end-off)
	if err != nil {
		return nil, err
	}
	defer plan.Release()
	var out []layout.Extent
	for _, pc := range plan.Pieces {
		s, t := max(pc.FileOff, off), min(pc.FileOff+pc.Len, end)
		if s >= t {
			continue
		}
		e := layout.Extent{FileOffset: uint64(s), Length: uint64(t - s)}
		if pc.Local() {
			e.PackID, e.PackOffset, e.Flags = pc.Pack, uint64(pc.PackOff+s-pc.FileOff), layout.ExtentLocal
		}
		if k := len(out) - 1; k >= 0 {
			p := &out[k]
			if p.Flags == e.Flags && p.PackID == e.PackID && p.FileOffset+p.Length == e.FileOffset &&
				(e.Flags&layout.ExtentLocal == 0 || p.PackOffset+p.Length == e.PackOffset) {
				p.Length += e.Length
				continue
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// committedFile returns the stored version of the file for the layout
// ioctls: EBUSY while the file is being written (its bytes are in a working
// copy, not in packs) or was never committed.
func (n *fileNode) committedFile() (*chunkstore.File, syscall.Errno) {
	n.mu.Lock()
	if n.hasLocalLocked() || n.id.IsZero() {
		n.mu.Unlock()
		return nil, syscall.EBUSY
	}
	sf, err := n.storeFileLocked()
	n.mu.Unlock()
	if err != nil {
		return nil, toErrno(err)
	}
	return sf, 0
}
