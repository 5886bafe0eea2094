package layout

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Query asks the open Kylix file fd for the extents of [off, off+n), n == 0
// meaning to the end of the file. At most MaxExtents come back; continue
// from Reply.NextOffset.
func Query(fd int, off, n uint64) (Reply, error) {
	b := EncodeRequest(Request{Offset: off, Length: n})
	if err := ioctl(fd, CmdLayout, b); err != nil {
		return Reply{}, fmt.Errorf("KYLIX_IOC_LAYOUT: %w", err)
	}
	return DecodeReply(b)
}

// PackPath asks the open Kylix file fd for the path of pack id.
func PackPath(fd int, id uint64) (string, error) {
	b := EncodePackPathRequest(id)
	if err := ioctl(fd, CmdPackPath, b); err != nil {
		return "", fmt.Errorf("KYLIX_IOC_PACK_PATH: %w", err)
	}
	return DecodePackPathReply(b)
}

// ProbeFD asks whether fd is a file (or directory) in a Kylix mount. An fd
// elsewhere gets an error wrapping ENOTTY (or EINVAL, ENOSYS: whatever the
// file system answers for an ioctl it does not know); IsKylix tells.
func ProbeFD(fd int) (Probe, error) {
	b := make([]byte, ProbeSize)
	if err := ioctl(fd, CmdProbe, b); err != nil {
		return Probe{}, fmt.Errorf("KYLIX_IOC_PROBE: %w", err)
	}
	return DecodeProbe(b)
}

// IsKylix reports whether fd is on a Kylix mount that serves layout v2.
func IsKylix(fd int) bool {
	_, err := ProbeFD(fd)
	return err == nil
}

// Chunks asks the open Kylix file fd for up to maxEntries (at most
// MaxChunkEntries) chunks from index first; maxEntries 0 asks only for the
// totals (NChunks, FileSize, FileID).
func Chunks(fd int, first uint64, maxEntries uint32) (ChunksReply, error) {
	if maxEntries > MaxChunkEntries {
		return ChunksReply{}, fmt.Errorf("%w: %d entries, at most %d per call", ErrInvalid, maxEntries, MaxChunkEntries)
	}
	b := EncodeChunksRequest(ChunksRequest{FirstChunk: first, MaxEntries: maxEntries})
	if err := ioctl(fd, CmdChunks(maxEntries), b); err != nil {
		return ChunksReply{}, fmt.Errorf("KYLIX_IOC_CHUNKS: %w", err)
	}
	return DecodeChunksReply(b)
}

// AllChunks returns every chunk of the open Kylix file fd: it asks for the
// totals, then pages MaxChunkEntries at a time. The entries are checked to
// cover the file from 0 to its size; a file that changed in between (its
// id differs from one page to the next) is an error wrapping ErrChanged.
func AllChunks(fd int) (ChunksReply, error) {
	tot, err := Chunks(fd, 0, 0)
	if err != nil {
		return ChunksReply{}, err
	}
	all := tot
	all.Entries = make([]Chunk, 0, tot.NChunks)
	var off uint64
	for uint64(len(all.Entries)) < tot.NChunks {
		page, err := Chunks(fd, uint64(len(all.Entries)), MaxChunkEntries)
		if err != nil {
			return ChunksReply{}, err
		}
		if page.FileID != tot.FileID || page.NChunks != tot.NChunks {
			return ChunksReply{}, fmt.Errorf("%w while its chunks were listed", ErrChanged)
		}
		if len(page.Entries) == 0 {
			return ChunksReply{}, fmt.Errorf("%w: empty page at chunk %d of %d", ErrInvalid, len(all.Entries), tot.NChunks)
		}
		if page.Entries[0].FileOffset != off {
			return ChunksReply{}, fmt.Errorf("%w: page starts at %d, want %d", ErrInvalid, page.Entries[0].FileOffset, off)
		}
		last := page.Entries[len(page.Entries)-1]
		off = last.FileOffset + uint64(last.Length)
		all.Entries = append(all.Entries, page.Entries...)
	}
	if off != tot.FileSize {
		return ChunksReply{}, fmt.Errorf("%w: chunks cover %d of %d bytes", ErrInvalid, off, tot.FileSize)
	}
	return all, nil
}

// Pack asks the open Kylix file fd for entry index of its pack table.
func Pack(fd int, index uint32) (PackInfo, error) {
	b := EncodePackRequest(index)
	if err := ioctl(fd, CmdPack, b); err != nil {
		return PackInfo{}, fmt.Errorf("KYLIX_IOC_PACK: %w", err)
	}
	return DecodePackReply(b)
}

// MakeLocal asks the node to make [off, off+n) of the open Kylix file fd
// local (n == 0: to the end). nil means every chunk of the range is
// stored on the node; EIO that some chunk is not and cannot be fetched.
func MakeLocal(fd int, off, n uint64) error {
	if err := ioctl(fd, CmdMakeLocal, EncodeMakeLocal(MakeLocalRequest{Offset: off, Length: n})); err != nil {
		return fmt.Errorf("KYLIX_IOC_MAKE_LOCAL: %w", err)
	}
	return nil
}

// Raw issues ioctl cmd on fd with buf as its argument (tests use it to send
// malformed requests).
func Raw(fd int, cmd uint32, buf []byte) error { return ioctl(fd, cmd, buf) }

func ioctl(fd int, cmd uint32, b []byte) error {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(p))
	if errno != 0 {
		return errno
	}
	return nil
}
