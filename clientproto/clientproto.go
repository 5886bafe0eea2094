// Package clientproto is the wire format of the node's client socket
// (docs/design/client.md): version 1 of the messages any local process
// exchanges with a running node over a unix SOCK_SEQPACKET socket, one
// datagram per message. libkylix (C) and the Python package mirror these
// layouts byte for byte, so the package imports nothing of ours and every
// struct is fixed-size little-endian with explicit reserved fields.
package clientproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Header fields.
const (
	Magic      = 0x4b594c43 // "KYLC" read as a little-endian u32
	Version    = 1
	HeaderSize = 16
	// ReplyBit is set in a reply's op.
	ReplyBit = 0x8000
)

// Ops.
const (
	OpPacks = 1
	OpFill  = 2
	OpStat  = 3
)

// Limits.
const (
	// MaxRanges bounds a FILL request's range list.
	MaxRanges = 4096
	// FillFixedSize is the fixed part of a FILL request body.
	FillFixedSize = 104
	// RangeSize is one FILL range entry.
	RangeSize = 24
	// StridedRangeSize is one FILL range entry with FillStrided.
	StridedRangeSize = 40
	// MaxStridedRanges bounds a FillStrided request's range list (so
	// that it fits MaxRequest too).
	MaxStridedRanges = 2048
	// MaxRequest is the largest request datagram: a FILL with MaxRanges.
	MaxRequest = HeaderSize + FillFixedSize + MaxRanges*RangeSize
	// MaxFds is the most descriptors a reply carries (PACKS).
	MaxFds = 16
)

// Pack entry flags (1 and 2 are the layout ioctl's pack_flags).
const (
	PackWholeFile = 1
	PackChecked   = 2
	// PackShared: the pack also holds other files' bytes (all readable by
	// the caller); only the chunks KYLIX_IOC_CHUNKS places in it are this
	// file's, and with PackChecked exactly those were hashed against the
	// file's manifest in the state the generation describes.
	PackShared = 4
)

// PACKS request flags (the optional 8-byte body {u32 flags; u32 reserved}).
const (
	// PacksShared asks for shared packs too (the LD_PRELOAD shim): each
	// one handed out only if every file with bytes in it is readable by
	// the caller and this file's chunks in it passed their check.
	PacksShared = 1
	// PacksRequestSize is the optional PACKS request body.
	PacksRequestSize = 8
)

// AppendPacksRequest appends a PACKS request body with flags.
func AppendPacksRequest(b []byte, flags uint32) []byte {
	b = le.AppendUint32(b, flags)
	return le.AppendUint32(b, 0)
}

// ParsePacksRequest decodes a PACKS request body: empty (version 1's
// request, flags 0) or {u32 flags; u32 reserved = 0} with known flags.
func ParsePacksRequest(b []byte) (uint32, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(b) != PacksRequestSize || le.Uint32(b[4:]) != 0 || le.Uint32(b)&^uint32(PacksShared) != 0 {
		return 0, ErrBody
	}
	return le.Uint32(b), nil
}

// FILL request flags.
const (
	FillVerify = 1 // verification on the GPU required
	FillStrict = 2 // the path asked for, or fail
	// FillStrided: the range entries are StridedRangeSize bytes, with
	// Rows and Pitch (a tensor-parallel share split along a later
	// dimension: one range per tensor, not one per row).
	FillStrided = 4
)

// Header starts every message.
type Header struct {
	Magic   uint32
	Version uint16
	Op      uint16
	Seq     uint32
	BodyLen uint32
}

// Errors of Parse*, each mapped to the errno the node answers with.
var (
	ErrShort      = fmt.Errorf("client message too short: %w", syscall.EINVAL)
	ErrMagic      = fmt.Errorf("bad magic: not a Kylix client message: %w", syscall.EPROTO)
	ErrVersion    = fmt.Errorf("unsupported client protocol version (this node speaks %d): %w", Version, syscall.EPROTONOSUPPORT)
	ErrBodyLength = fmt.Errorf("client message: body_len does not match the datagram: %w", syscall.EINVAL)
	ErrBody       = fmt.Errorf("malformed client message body: %w", syscall.EINVAL)
)

var le = binary.LittleEndian

// AppendHeader appends h.
func AppendHeader(b []byte, h Header) []byte {
	b = le.AppendUint32(b, h.Magic)
	b = le.AppendUint16(b, h.Version)
	b = le.AppendUint16(b, h.Op)
	b = le.AppendUint32(b, h.Seq)
	return le.AppendUint32(b, h.BodyLen)
}

// ParseHeader decodes the header of datagram b and checks magic, version
// and that body_len is the rest of the datagram. The header is returned
// even when a check fails (as far as it could be read), so the node can
// echo the seq in its refusal.
func ParseHeader(b []byte) (Header, []byte, error) {
	if len(b) < HeaderSize {
		return Header{}, nil, ErrShort
	}
	h := Header{Magic: le.Uint32(b), Version: le.Uint16(b[4:]), Op: le.Uint16(b[6:]), Seq: le.Uint32(b[8:]), BodyLen: le.Uint32(b[12:])}
	switch {
	case h.Magic != Magic:
		return h, nil, ErrMagic
	case h.Version != Version:
		return h, nil, ErrVersion
	case uint64(h.BodyLen) != uint64(len(b)-HeaderSize):
		return h, nil, ErrBodyLength
	}
	return h, b[HeaderSize:], nil
}

// Request builds a request datagram.
func Request(op uint16, seq uint32, body []byte) []byte {
	b := AppendHeader(make([]byte, 0, HeaderSize+len(body)), Header{Magic: Magic, Version: Version, Op: op, Seq: seq, BodyLen: uint32(len(body))})
	return append(b, body...)
}

// Reply builds a reply datagram: status is 0 or -errno, msg is for humans,
// fields are the op's reply fields.
func Reply(op uint16, seq uint32, status int32, msg string, fields []byte) []byte {
	body := make([]byte, 0, 8+len(msg)+len(fields))
	body = le.AppendUint32(body, uint32(status))
	body = le.AppendUint32(body, uint32(len(msg)))
	body = append(body, msg...)
	body = append(body, fields...)
	return Request(op|ReplyBit, seq, body)
}

// ParseReply decodes a reply datagram.
func ParseReply(b []byte) (h Header, status int32, msg string, fields []byte, err error) {
	h, body, err := ParseHeader(b)
	if err != nil {
		return h, 0, "", nil, err
	}
	if len(body) < 8 {
		return h, 0, "", nil, ErrBody
	}
	status = int32(le.Uint32(body))
	n := le.Uint32(body[4:])
	if uint64(n) > uint64(len(body)-8) {
		return h, 0, "", nil, ErrBody
	}
	return h, status, string(body[8 : 8+n]), body[8+n:], nil
}

// PackEntry describes one pack fd of a PACKS reply.
type PackEntry struct {
	PackIndex  uint32
	Flags      uint32
	Generation uint64
	Size       uint64
}

// PackEntrySize is an encoded PackEntry.
const PackEntrySize = 24

// AppendPacks encodes the PACKS reply fields.
func AppendPacks(b []byte, es []PackEntry) []byte {
	b = le.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		b = le.AppendUint32(b, e.PackIndex)
		b = le.AppendUint32(b, e.Flags)
		b = le.AppendUint64(b, e.Generation)
		b = le.AppendUint64(b, e.Size)
	}
	return b
}

// ParsePacks decodes the PACKS reply fields.
func ParsePacks(b []byte) ([]PackEntry, error) {
	if len(b) < 4 {
		return nil, ErrBody
	}
	n := le.Uint32(b)
	if n > MaxFds || len(b) != 4+int(n)*PackEntrySize {
		return nil, ErrBody
	}
	es := make([]PackEntry, n)
	for i := range es {
		p := b[4+i*PackEntrySize:]
		es[i] = PackEntry{PackIndex: le.Uint32(p), Flags: le.Uint32(p[4:]), Generation: le.Uint64(p[8:]), Size: le.Uint64(p[16:])}
	}
	return es, nil
}

// StatReply is the STAT reply fields.
type StatReply struct {
	Size        uint64
	FileID      [32]byte
	NChunks     uint32
	LocalChunks uint32
}

// StatReplySize is an encoded StatReply.
const StatReplySize = 48

// Append encodes r.
func (r StatReply) Append(b []byte) []byte {
	b = le.AppendUint64(b, r.Size)
	b = append(b, r.FileID[:]...)
	b = le.AppendUint32(b, r.NChunks)
	return le.AppendUint32(b, r.LocalChunks)
}

// ParseStat decodes the STAT reply fields.
func ParseStat(b []byte) (StatReply, error) {
	var r StatReply
	if len(b) != StatReplySize {
		return r, ErrBody
	}
	r.Size = le.Uint64(b)
	copy(r.FileID[:], b[8:40])
	r.NChunks, r.LocalChunks = le.Uint32(b[40:]), le.Uint32(b[44:])
	return r, nil
}

// Range is one FILL range: file bytes [FileOffset, FileOffset+Length) go to
// the caller's allocation at DstOffset. With Rows > 1 (FillStrided) it is
// Rows such rows, Pitch bytes apart in the file, packed densely at
// DstOffset (row i at DstOffset + i*Length). Rows 0 means 1.
type Range struct {
	FileOffset uint64
	Length     uint64
	DstOffset  uint64
	Rows       uint64
	Pitch      uint64
}

// FillRequest is a FILL request body.
type FillRequest struct {
	Device    uint32
	Flags     uint32
	IPCHandle [64]byte
	// DstOffset, FileOffset, Length: the single range when Ranges is empty.
	DstOffset  uint64
	FileOffset uint64
	Length     uint64
	Ranges     []Range
}

// Append encodes r.
func (r FillRequest) Append(b []byte) []byte {
	b = le.AppendUint32(b, r.Device)
	b = le.AppendUint32(b, r.Flags)
	b = append(b, r.IPCHandle[:]...)
	b = le.AppendUint64(b, r.DstOffset)
	b = le.AppendUint64(b, r.FileOffset)
	b = le.AppendUint64(b, r.Length)
	b = le.AppendUint32(b, uint32(len(r.Ranges)))
	b = le.AppendUint32(b, 0)
	for _, x := range r.Ranges {
		b = le.AppendUint64(b, x.FileOffset)
		b = le.AppendUint64(b, x.Length)
		b = le.AppendUint64(b, x.DstOffset)
		if r.Flags&FillStrided != 0 {
			b = le.AppendUint64(b, x.Rows)
			b = le.AppendUint64(b, x.Pitch)
		}
	}
	return b
}

// ErrTooManyRanges: n_ranges above MaxRanges.
var ErrTooManyRanges = fmt.Errorf("more ranges than a FILL takes (%d, or %d strided): %w", MaxRanges, MaxStridedRanges, syscall.E2BIG)

// ParseFill decodes a FILL request body. It checks the layout only (sizes,
// reserved zero, range count); the node checks every range against the
// file and the allocation.
func ParseFill(b []byte) (FillRequest, error) {
	var r FillRequest
	if len(b) < FillFixedSize {
		return r, ErrBody
	}
	r.Device, r.Flags = le.Uint32(b), le.Uint32(b[4:])
	copy(r.IPCHandle[:], b[8:72])
	r.DstOffset, r.FileOffset, r.Length = le.Uint64(b[72:]), le.Uint64(b[80:]), le.Uint64(b[88:])
	n, reserved := le.Uint32(b[96:]), le.Uint32(b[100:])
	if reserved != 0 || r.Flags&^(FillVerify|FillStrict|FillStrided) != 0 {
		return r, ErrBody
	}
	size, max := RangeSize, uint32(MaxRanges)
	if r.Flags&FillStrided != 0 {
		size, max = StridedRangeSize, MaxStridedRanges
	}
	if n > max {
		return r, ErrTooManyRanges
	}
	if len(b) != FillFixedSize+int(n)*size {
		return r, ErrBody
	}
	for i := range int(n) {
		p := b[FillFixedSize+i*size:]
		x := Range{FileOffset: le.Uint64(p), Length: le.Uint64(p[8:]), DstOffset: le.Uint64(p[16:])}
		if size == StridedRangeSize {
			x.Rows, x.Pitch = le.Uint64(p[24:]), le.Uint64(p[32:])
		}
		r.Ranges = append(r.Ranges, x)
	}
	return r, nil
}

// List returns the ranges of r: Ranges, or the single range.
func (r FillRequest) List() []Range {
	if len(r.Ranges) > 0 {
		return r.Ranges
	}
	return []Range{{FileOffset: r.FileOffset, Length: r.Length, DstOffset: r.DstOffset}}
}

// FillReply is the FILL reply fields.
type FillReply struct {
	Bytes    uint64
	Nanos    uint64
	Path     string
	IO       string
	Verified string
}

// FillReplySize is an encoded FillReply.
const FillReplySize = 16 + 3*32

// Append encodes r; the names are cut to 31 bytes and NUL-padded.
func (r FillReply) Append(b []byte) []byte {
	b = le.AppendUint64(b, r.Bytes)
	b = le.AppendUint64(b, r.Nanos)
	for _, s := range []string{r.Path, r.IO, r.Verified} {
		var f [32]byte
		copy(f[:31], s)
		b = append(b, f[:]...)
	}
	return b
}

// ParseFillReply decodes the FILL reply fields.
func ParseFillReply(b []byte) (FillReply, error) {
	if len(b) != FillReplySize {
		return FillReply{}, ErrBody
	}
	cstr := func(p []byte) string {
		for i, c := range p {
			if c == 0 {
				return string(p[:i])
			}
		}
		return string(p)
	}
	return FillReply{Bytes: le.Uint64(b), Nanos: le.Uint64(b[8:]), Path: cstr(b[16:48]), IO: cstr(b[48:80]), Verified: cstr(b[80:112])}, nil
}

// Errno returns the errno err wraps (EIO when none): the status a reply
// carries is its negation.
func Errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
