// Package layout defines the layout ioctls that open files in a Kylix mount
// answer. Version 1: the extents of a byte range (which pack file and
// offset hold each part, or "not local") and the path of a pack file.
// Version 2 (v2.go): a probe (is this fd on Kylix, where is the node's
// client socket), the file's chunks with their BLAKE3 ids (paged), the
// file's pack table with a generation number per pack, and "make this
// range local". A reader uses them to bypass FUSE and read the backing
// files directly, verifying what it reads (docs/design/ioctl.md).
//
// The wire structs are fixed-size and little-endian, mirrored in the C header
// kylix_layout.h beside this file. Decoders check every field: a request that
// is malformed in any way is rejected with ErrInvalid (EINVAL), never
// trusted.
package layout

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire constants, as in kylix_layout.h.
const (
	Magic       = 0x4b594c58 // "KYLX"
	Version     = 1
	MaxExtents  = 16
	PackPathMax = 4096

	// ExtentLocal: the extent is stored in pack PackID at PackOffset.
	ExtentLocal = 0x1
	// ExtentWholeFile: the pack holds exactly this file from offset 0.
	ExtentWholeFile = 0x2

	extentSize = 40
	headerSize = 80
	// LayoutSize is sizeof(struct kylix_layout).
	LayoutSize = headerSize + MaxExtents*extentSize
	// PackPathSize is sizeof(struct kylix_pack_path).
	PackPathSize = 24 + PackPathMax
)

// Linux ioctl number encoding (asm-generic/ioctl.h).
const (
	iocWrite = 1
	iocRead  = 2
)

func iowr(typ, nr, size uint32) uint32 {
	return (iocRead|iocWrite)<<30 | size<<16 | typ<<8 | nr
}

// Ioctl command numbers: _IOWR('K', 1, struct kylix_layout) and
// _IOWR('K', 2, struct kylix_pack_path).
var (
	CmdLayout   = iowr('K', 1, LayoutSize)
	CmdPackPath = iowr('K', 2, PackPathSize)
)

// ErrInvalid is returned for a request that breaks a rule of the header.
var ErrInvalid = errors.New("invalid layout request")

// ErrChanged is returned by AllChunks when the file was replaced between
// two pages.
var ErrChanged = errors.New("the file changed")

var le = binary.LittleEndian

// Extent is one run of a file's bytes.
type Extent struct {
	FileOffset uint64
	Length     uint64
	PackID     uint64 // 0: not local
	PackOffset uint64
	Flags      uint32
}

// Request is the input part of struct kylix_layout.
type Request struct {
	Offset uint64
	Length uint64 // 0: to the end of the file
}

// Reply is the output part of struct kylix_layout.
type Reply struct {
	FileSize   uint64
	NextOffset uint64
	FileID     [32]byte
	Extents    []Extent
}

func checkHeader(b []byte) error {
	if le.Uint32(b[0:]) != Magic {
		return fmt.Errorf("%w: bad magic %#x", ErrInvalid, le.Uint32(b[0:]))
	}
	if v := le.Uint16(b[4:]); v != Version {
		return fmt.Errorf("%w: version %d, want %d", ErrInvalid, v, Version)
	}
	if f := le.Uint16(b[6:]); f != 0 {
		return fmt.Errorf("%w: flags %#x must be zero", ErrInvalid, f)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// DecodeRequest checks a struct kylix_layout as sent by a caller.
func DecodeRequest(b []byte) (Request, error) {
	if len(b) != LayoutSize {
		return Request{}, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), LayoutSize)
	}
	if err := checkHeader(b); err != nil {
		return Request{}, err
	}
	r := Request{Offset: le.Uint64(b[8:]), Length: le.Uint64(b[16:])}
	if r.Offset+r.Length < r.Offset || r.Offset > 1<<62 || r.Length > 1<<62 {
		return Request{}, fmt.Errorf("%w: range [%d, +%d) overflows", ErrInvalid, r.Offset, r.Length)
	}
	if !allZero(b[24:]) {
		return Request{}, fmt.Errorf("%w: output and reserved fields must be zero", ErrInvalid)
	}
	return r, nil
}

// EncodeRequest makes the bytes of a request (the caller's side).
func EncodeRequest(r Request) []byte {
	b := make([]byte, LayoutSize)
	le.PutUint32(b[0:], Magic)
	le.PutUint16(b[4:], Version)
	le.PutUint64(b[8:], r.Offset)
	le.PutUint64(b[16:], r.Length)
	return b
}

// EncodeReply writes a reply over the request bytes b.
func EncodeReply(b []byte, r Reply) error {
	if len(b) != LayoutSize || len(r.Extents) > MaxExtents {
		return fmt.Errorf("%w: reply does not fit", ErrInvalid)
	}
	le.PutUint64(b[24:], r.FileSize)
	le.PutUint64(b[32:], r.NextOffset)
	le.PutUint32(b[40:], uint32(len(r.Extents)))
	le.PutUint32(b[44:], 0)
	copy(b[48:80], r.FileID[:])
	for i := range MaxExtents {
		e := b[headerSize+i*extentSize : headerSize+(i+1)*extentSize]
		clear(e)
		if i >= len(r.Extents) {
			continue
		}
		x := r.Extents[i]
		le.PutUint64(e[0:], x.FileOffset)
		le.PutUint64(e[8:], x.Length)
		le.PutUint64(e[16:], x.PackID)
		le.PutUint64(e[24:], x.PackOffset)
		le.PutUint32(e[32:], x.Flags)
	}
	return nil
}

// DecodeReply parses a reply (the caller's side), checking that it is
// self-consistent.
func DecodeReply(b []byte) (Reply, error) {
	if len(b) != LayoutSize {
		return Reply{}, fmt.Errorf("%w: %d bytes", ErrInvalid, len(b))
	}
	var r Reply
	r.FileSize = le.Uint64(b[24:])
	r.NextOffset = le.Uint64(b[32:])
	n := le.Uint32(b[40:])
	if n > MaxExtents {
		return Reply{}, fmt.Errorf("%w: %d extents", ErrInvalid, n)
	}
	copy(r.FileID[:], b[48:80])
	for i := range int(n) {
		e := b[headerSize+i*extentSize:]
		r.Extents = append(r.Extents, Extent{
			FileOffset: le.Uint64(e[0:]), Length: le.Uint64(e[8:]),
			PackID: le.Uint64(e[16:]), PackOffset: le.Uint64(e[24:]), Flags: le.Uint32(e[32:]),
		})
	}
	return r, nil
}

// DecodePackPathRequest checks a struct kylix_pack_path and returns its
// pack id.
func DecodePackPathRequest(b []byte) (uint64, error) {
	if len(b) != PackPathSize {
		return 0, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), PackPathSize)
	}
	if err := checkHeader(b); err != nil {
		return 0, err
	}
	id := le.Uint64(b[8:])
	if id == 0 {
		return 0, fmt.Errorf("%w: pack id 0 means not local", ErrInvalid)
	}
	if !allZero(b[16:]) {
		return 0, fmt.Errorf("%w: output and reserved fields must be zero", ErrInvalid)
	}
	return id, nil
}

// EncodePackPathRequest makes the bytes of a pack path request.
func EncodePackPathRequest(id uint64) []byte {
	b := make([]byte, PackPathSize)
	le.PutUint32(b[0:], Magic)
	le.PutUint16(b[4:], Version)
	le.PutUint64(b[8:], id)
	return b
}

// EncodePackPathReply writes path into the request bytes b.
func EncodePackPathReply(b []byte, path string) error {
	if len(b) != PackPathSize || len(path) >= PackPathMax {
		return fmt.Errorf("%w: path of %d bytes does not fit", ErrInvalid, len(path))
	}
	le.PutUint32(b[16:], uint32(len(path)))
	le.PutUint32(b[20:], 0)
	clear(b[24:])
	copy(b[24:], path)
	return nil
}

// DecodePackPathReply returns the path in a reply.
func DecodePackPathReply(b []byte) (string, error) {
	if len(b) != PackPathSize {
		return "", fmt.Errorf("%w: %d bytes", ErrInvalid, len(b))
	}
	n := le.Uint32(b[16:])
	if n >= PackPathMax {
		return "", fmt.Errorf("%w: path length %d", ErrInvalid, n)
	}
	return string(b[24 : 24+n]), nil
}
