package gpuio

import (
	"fmt"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
)

// group is one read: whole chunks lying back to back in one pack, fitting one
// buffer with the alignment slack; or, with pack 0, chunks not stored here
// that lie back to back in the file, fetched from the members (from is the
// file they belong to; each chunk's PackOff is then its offset in the
// group's bytes).
type group struct {
	from      *chunkstore.File
	pack      uint64
	readOff   int64 // aligned down
	readLen   int64 // aligned up
	dataOff   int64 // pack offset of the first chunk
	fileOff   int64 // file offset of the first chunk
	dataLen   int64 // bytes of the chunks
	chunks    []chunkstore.Piece
	copyStart int64 // file range to place on the device: [copyStart, copyEnd)
	copyEnd   int64
}

// planGroups cuts the pieces of f (of a chunkstore.Plan, whose leases the
// caller holds while the groups are read) overlapping [off, off+n) into
// groups. Pieces not stored here make groups of their own, which the
// pipeline fetches (Loader.fetchInto).
func planGroups(f *chunkstore.File, layout []chunkstore.Piece, off, n int64, bufSize int) ([]group, error) {
	end := off + n
	var gs []group
	for _, c := range layout {
		if c.FileOff+c.Len <= off || c.FileOff >= end {
			continue
		}
		if c.Len+2*storeio.BlockSize > int64(bufSize) {
			return nil, fmt.Errorf("chunk %s of %d bytes does not fit a %d-byte buffer (raise BufferSize)", c.ID.Short(), c.Len, bufSize)
		}
		if c.Pack == 0 {
			if k := len(gs) - 1; k >= 0 && gs[k].pack == 0 && gs[k].fileOff+gs[k].dataLen == c.FileOff && gs[k].dataLen+c.Len <= int64(bufSize) {
				g := &gs[k]
				c.PackOff = g.dataLen
				g.chunks = append(g.chunks, c)
				g.dataLen += c.Len
				g.readLen = g.dataLen
				g.copyEnd = min(end, c.FileOff+c.Len)
				continue
			}
			c.PackOff = 0
			gs = append(gs, group{
				from: f, readLen: c.Len, fileOff: c.FileOff, dataLen: c.Len,
				chunks:    []chunkstore.Piece{c},
				copyStart: max(off, c.FileOff), copyEnd: min(end, c.FileOff+c.Len),
			})
			continue
		}
		if k := len(gs) - 1; k >= 0 {
			g := &gs[k]
			newEnd := storeio.AlignUp(c.PackOff + c.Len)
			if g.pack == c.Pack && g.dataOff+g.dataLen == c.PackOff && newEnd-g.readOff <= int64(bufSize) {
				g.chunks = append(g.chunks, c)
				g.dataLen += c.Len
				g.readLen = newEnd - g.readOff
				g.copyEnd = min(end, c.FileOff+c.Len)
				continue
			}
		}
		ro := storeio.AlignDown(c.PackOff)
		gs = append(gs, group{
			from: f, pack: c.Pack, readOff: ro, readLen: storeio.AlignUp(c.PackOff+c.Len) - ro,
			dataOff: c.PackOff, fileOff: c.FileOff, dataLen: c.Len,
			chunks:    []chunkstore.Piece{c},
			copyStart: max(off, c.FileOff), copyEnd: min(end, c.FileOff+c.Len),
		})
	}
	return gs, nil
}
