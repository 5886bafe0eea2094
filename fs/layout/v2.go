package layout

import (
	"fmt"
	"strings"
)

// Layout v2 (docs/design/ioctl.md): four ioctls, each a fixed little-endian
// struct mirrored field by field in kylix_layout.h.
//
//	KYLIX_IOC_PROBE      is this fd on Kylix; which version; where the node's
//	                     client socket is
//	KYLIX_IOC_CHUNKS     the file's chunks, paged: offset, length, BLAKE3 id,
//	                     pack index and pack offset of each
//	KYLIX_IOC_PACK       one entry of the file's pack table: path, size,
//	                     generation, flags
//	KYLIX_IOC_MAKE_LOCAL make a byte range local (or say it cannot be)
//
// FUSE ioctls on regular files are "restricted": the kernel moves exactly
// _IOC_SIZE(cmd) bytes, a 14-bit field, so one call moves at most 16383
// bytes. That is why KYLIX_IOC_CHUNKS pages and why its command number
// carries the caller's buffer size.

// v2 wire constants, as in kylix_layout.h.
const (
	// Version2 is the layout version of the v2 ioctls, and the highest
	// version KYLIX_IOC_PROBE reports.
	Version2 = 2

	// ProbeSize is sizeof(struct kylix_probe).
	ProbeSize = 256
	// ClientSocketMax is sizeof(kylix_probe.client_socket), NUL included.
	ClientSocketMax = 240

	// ChunksHeaderSize is sizeof(struct kylix_chunks), the header that
	// precedes the entries.
	ChunksHeaderSize = 72
	// ChunkEntrySize is sizeof(struct kylix_chunk).
	ChunkEntrySize = 64
	// MaxChunkEntries is the most entries one KYLIX_IOC_CHUNKS call can
	// carry: ChunksHeaderSize + MaxChunkEntries*ChunkEntrySize is the
	// largest such size below 1<<14 (_IOC_SIZE has 14 bits).
	MaxChunkEntries = 254

	// PackSize is sizeof(struct kylix_pack).
	PackSize = 4096
	// PackPathMaxV2 is sizeof(kylix_pack.path), NUL included.
	PackPathMaxV2 = PackSize - 40

	// MakeLocalSize is sizeof(struct kylix_make_local).
	MakeLocalSize = 24

	// ChunkLocal (kylix_chunk.flags): the chunk is stored in pack
	// PackIndex of the file's pack table at PackOffset.
	ChunkLocal = 0x1
	// NoPack is kylix_chunk.pack_index of a chunk that is not local.
	NoPack = ^uint32(0)

	// PackWholeFile (kylix_pack.pack_flags): the pack holds exactly this
	// file's bytes from offset 0, and nothing else.
	PackWholeFile = 0x1
	// PackChecked (kylix_pack.pack_flags): the pack, in the state that
	// Generation describes, passed the passthrough pack check (hashed whole
	// against this file's manifest; docs/design/verification.md).
	PackChecked = 0x2
)

// Ioctl command numbers of v2. KYLIX_IOC_CHUNKS has one number per buffer
// size: CmdChunks(n).
var (
	CmdProbe     = ioc(iocRead, 'K', 3, ProbeSize)
	CmdPack      = ioc(iocRead|iocWrite, 'K', 5, PackSize)
	CmdMakeLocal = ioc(iocWrite, 'K', 6, MakeLocalSize)
)

// Command numbers' nr fields ('K', nr).
const (
	NrLayout    = 1
	NrPackPath  = 2
	NrProbe     = 3
	NrChunks    = 4
	NrPack      = 5
	NrMakeLocal = 6
)

func ioc(dir, typ, nr, size uint32) uint32 {
	return dir<<30 | size<<16 | typ<<8 | nr
}

// CmdChunks is KYLIX_IOC_CHUNKS for a buffer of maxEntries entries:
// _IOC(_IOC_READ|_IOC_WRITE, 'K', 4, ChunksSize(maxEntries)). maxEntries
// must be at most MaxChunkEntries.
func CmdChunks(maxEntries uint32) uint32 {
	return ioc(iocRead|iocWrite, 'K', NrChunks, ChunksSize(maxEntries))
}

// ChunksSize is the buffer size of a KYLIX_IOC_CHUNKS call with maxEntries
// entries.
func ChunksSize(maxEntries uint32) uint32 {
	return ChunksHeaderSize + ChunkEntrySize*maxEntries
}

// Cmd is a decoded ioctl command number.
type Cmd struct {
	Read, Write bool // _IOC_DIR
	Type, Nr    uint8
	Size        uint32 // _IOC_SIZE
}

// DecodeCmd splits an ioctl command number (asm-generic/ioctl.h).
func DecodeCmd(cmd uint32) Cmd {
	dir := cmd >> 30
	return Cmd{Read: dir&iocRead != 0, Write: dir&iocWrite != 0,
		Type: uint8(cmd >> 8), Nr: uint8(cmd), Size: cmd >> 16 & (1<<14 - 1)}
}

// Generation is the generation number of a pack file in the state that
// fstat reports: FNV-1a (64-bit) over the 40 little-endian bytes of
// st_dev, st_ino, st_size, st_mtime in nanoseconds and st_ctime in
// nanoseconds, with 0 mapped to 1 (0 means "unknown"). Any write to the
// file changes mtime or ctime, and a replaced file has another inode, so a
// reader that recomputes it from fstat of the descriptor it opened, and
// compares, notices a pack that changed since the node answered.
// kylix_pack_generation in kylix_layout.h is the same function.
func Generation(dev, ino uint64, size, mtimeNs, ctimeNs int64) uint64 {
	var b [40]byte
	le.PutUint64(b[0:], dev)
	le.PutUint64(b[8:], ino)
	le.PutUint64(b[16:], uint64(size))
	le.PutUint64(b[24:], uint64(mtimeNs))
	le.PutUint64(b[32:], uint64(ctimeNs))
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	if h == 0 {
		h = 1
	}
	return h
}

func checkHeader2(b []byte) error {
	if m := le.Uint32(b[0:]); m != Magic {
		return fmt.Errorf("%w: bad magic %#x", ErrInvalid, m)
	}
	if v := le.Uint16(b[4:]); v != Version2 {
		return fmt.Errorf("%w: version %d, want %d", ErrInvalid, v, Version2)
	}
	if f := le.Uint16(b[6:]); f != 0 {
		return fmt.Errorf("%w: flags %#x must be zero", ErrInvalid, f)
	}
	return nil
}

func putHeader2(b []byte) {
	le.PutUint32(b[0:], Magic)
	le.PutUint16(b[4:], Version2)
	le.PutUint16(b[6:], 0)
}

// cString returns the NUL-terminated string in b, which must hold a NUL.
func cString(b []byte) (string, error) {
	i := strings.IndexByte(string(b), 0)
	if i < 0 {
		return "", fmt.Errorf("%w: string not NUL-terminated", ErrInvalid)
	}
	return string(b[:i]), nil
}

// ---- KYLIX_IOC_PROBE ----

// Probe is struct kylix_probe (all out).
type Probe struct {
	Version      uint32 // highest layout version served
	NodePID      uint64
	ClientSocket string // "" when the node has none
}

// EncodeProbe writes p into b (the node's side). A client socket path that
// does not fit is an error.
func EncodeProbe(b []byte, p Probe) error {
	if len(b) != ProbeSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), ProbeSize)
	}
	if len(p.ClientSocket) >= ClientSocketMax || strings.IndexByte(p.ClientSocket, 0) >= 0 {
		return fmt.Errorf("%w: client socket path of %d bytes does not fit in %d", ErrInvalid, len(p.ClientSocket), ClientSocketMax)
	}
	clear(b)
	le.PutUint32(b[0:], Magic)
	le.PutUint32(b[4:], p.Version)
	le.PutUint64(b[8:], p.NodePID)
	copy(b[16:], p.ClientSocket)
	return nil
}

// DecodeProbe parses a probe reply (the caller's side): the magic must be
// Kylix's, else the fd is not on Kylix.
func DecodeProbe(b []byte) (Probe, error) {
	if len(b) != ProbeSize {
		return Probe{}, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), ProbeSize)
	}
	if m := le.Uint32(b[0:]); m != Magic {
		return Probe{}, fmt.Errorf("%w: bad magic %#x: not a Kylix file", ErrInvalid, m)
	}
	p := Probe{Version: le.Uint32(b[4:]), NodePID: le.Uint64(b[8:])}
	if p.Version < Version2 {
		return Probe{}, fmt.Errorf("%w: probe reports version %d", ErrInvalid, p.Version)
	}
	s, err := cString(b[16:])
	if err != nil {
		return Probe{}, err
	}
	p.ClientSocket = s
	return p, nil
}

// ---- KYLIX_IOC_CHUNKS ----

// ChunksRequest is the input part of struct kylix_chunks.
type ChunksRequest struct {
	FirstChunk uint64 // index of the first chunk wanted
	MaxEntries uint32 // entries the buffer holds; 0: totals only
}

// Chunk is struct kylix_chunk: one chunk of the file.
type Chunk struct {
	FileOffset uint64
	Length     uint32
	Flags      uint32 // ChunkLocal
	PackIndex  uint32 // index into the file's pack table; NoPack when not local
	PackOffset uint64
	ID         [32]byte // BLAKE3-256 of the chunk's bytes
}

// Local says whether the chunk is stored in a pack of this node.
func (c Chunk) Local() bool { return c.Flags&ChunkLocal != 0 }

// ChunksReply is the output part of struct kylix_chunks and its entries.
type ChunksReply struct {
	NChunks  uint64 // the file's chunk count
	FileSize uint64
	FileID   [32]byte // the file's manifest id
	Entries  []Chunk
}

// EncodeChunksRequest makes the bytes of a request (the caller's side).
func EncodeChunksRequest(r ChunksRequest) []byte {
	b := make([]byte, ChunksSize(r.MaxEntries))
	putHeader2(b)
	le.PutUint64(b[8:], r.FirstChunk)
	le.PutUint32(b[16:], r.MaxEntries)
	return b
}

// DecodeChunksRequest checks a struct kylix_chunks as sent by a caller;
// size is _IOC_SIZE of the command (the node's side). The entries area
// is output only and not looked at.
func DecodeChunksRequest(b []byte, size uint32) (ChunksRequest, error) {
	if uint32(len(b)) != size || len(b) < ChunksHeaderSize {
		return ChunksRequest{}, fmt.Errorf("%w: %d bytes with _IOC_SIZE %d", ErrInvalid, len(b), size)
	}
	if err := checkHeader2(b); err != nil {
		return ChunksRequest{}, err
	}
	r := ChunksRequest{FirstChunk: le.Uint64(b[8:]), MaxEntries: le.Uint32(b[16:])}
	if r.MaxEntries > MaxChunkEntries {
		return ChunksRequest{}, fmt.Errorf("%w: max_entries %d above %d", ErrInvalid, r.MaxEntries, MaxChunkEntries)
	}
	if ChunksSize(r.MaxEntries) != size {
		return ChunksRequest{}, fmt.Errorf("%w: max_entries %d needs %d bytes, _IOC_SIZE is %d", ErrInvalid, r.MaxEntries, ChunksSize(r.MaxEntries), size)
	}
	if !allZero(b[20:ChunksHeaderSize]) {
		return ChunksRequest{}, fmt.Errorf("%w: output fields must be zero", ErrInvalid)
	}
	return r, nil
}

// EncodeChunksReply writes a reply over the request bytes b (the node's
// side); the entries area is rewritten whole.
func EncodeChunksReply(b []byte, r ChunksReply) error {
	if len(b) < ChunksHeaderSize || (len(b)-ChunksHeaderSize)%ChunkEntrySize != 0 ||
		len(r.Entries) > (len(b)-ChunksHeaderSize)/ChunkEntrySize {
		return fmt.Errorf("%w: %d entries do not fit in %d bytes", ErrInvalid, len(r.Entries), len(b))
	}
	le.PutUint32(b[20:], uint32(len(r.Entries)))
	le.PutUint64(b[24:], r.NChunks)
	le.PutUint64(b[32:], r.FileSize)
	copy(b[40:72], r.FileID[:])
	clear(b[ChunksHeaderSize:])
	for i, c := range r.Entries {
		e := b[ChunksHeaderSize+i*ChunkEntrySize:]
		le.PutUint64(e[0:], c.FileOffset)
		le.PutUint32(e[8:], c.Length)
		le.PutUint32(e[12:], c.Flags)
		le.PutUint32(e[16:], c.PackIndex)
		le.PutUint32(e[20:], 0)
		le.PutUint64(e[24:], c.PackOffset)
		copy(e[32:64], c.ID[:])
	}
	return nil
}

// DecodeChunksReply parses a reply (the caller's side) and checks that it
// is self-consistent: n_entries fits the buffer, the entries are back to
// back in file order inside the file, a local entry names a pack index and
// a missing one NoPack, reserved fields are zero.
func DecodeChunksReply(b []byte) (ChunksReply, error) {
	if len(b) < ChunksHeaderSize || (len(b)-ChunksHeaderSize)%ChunkEntrySize != 0 {
		return ChunksReply{}, fmt.Errorf("%w: reply of %d bytes", ErrInvalid, len(b))
	}
	r := ChunksReply{NChunks: le.Uint64(b[24:]), FileSize: le.Uint64(b[32:])}
	copy(r.FileID[:], b[40:72])
	n := le.Uint32(b[20:])
	if int(n) > (len(b)-ChunksHeaderSize)/ChunkEntrySize {
		return ChunksReply{}, fmt.Errorf("%w: %d entries in a buffer of %d", ErrInvalid, n, (len(b)-ChunksHeaderSize)/ChunkEntrySize)
	}
	for i := range int(n) {
		e := b[ChunksHeaderSize+i*ChunkEntrySize:]
		c := Chunk{FileOffset: le.Uint64(e[0:]), Length: le.Uint32(e[8:]), Flags: le.Uint32(e[12:]),
			PackIndex: le.Uint32(e[16:]), PackOffset: le.Uint64(e[24:])}
		copy(c.ID[:], e[32:64])
		switch {
		case le.Uint32(e[20:]) != 0 || c.Flags&^ChunkLocal != 0:
			return ChunksReply{}, fmt.Errorf("%w: entry %d: reserved bits set", ErrInvalid, i)
		case c.Local() == (c.PackIndex == NoPack):
			return ChunksReply{}, fmt.Errorf("%w: entry %d: flags %#x with pack index %d", ErrInvalid, i, c.Flags, c.PackIndex)
		case c.Length == 0 || c.FileOffset > r.FileSize || uint64(c.Length) > r.FileSize-c.FileOffset:
			return ChunksReply{}, fmt.Errorf("%w: entry %d: [%d, +%d) outside the file of %d bytes", ErrInvalid, i, c.FileOffset, c.Length, r.FileSize)
		case i > 0 && r.Entries[i-1].FileOffset+uint64(r.Entries[i-1].Length) != c.FileOffset:
			return ChunksReply{}, fmt.Errorf("%w: entry %d at %d does not follow the one before", ErrInvalid, i, c.FileOffset)
		}
		r.Entries = append(r.Entries, c)
	}
	return r, nil
}

// ---- KYLIX_IOC_PACK ----

// PackInfo is the output part of struct kylix_pack.
type PackInfo struct {
	NPacks     uint32 // packs in this file's table
	Generation uint64 // see Generation
	Size       uint64 // the pack file's size
	Flags      uint32 // PackWholeFile, PackChecked
	Path       string // absolute path of the pack file on the node
}

// EncodePackRequest makes the bytes of a request for entry index of the
// file's pack table (the caller's side).
func EncodePackRequest(index uint32) []byte {
	b := make([]byte, PackSize)
	putHeader2(b)
	le.PutUint32(b[8:], index)
	return b
}

// DecodePackRequest checks a struct kylix_pack as sent by a caller and
// returns the pack index asked for (the node's side).
func DecodePackRequest(b []byte) (uint32, error) {
	if len(b) != PackSize {
		return 0, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), PackSize)
	}
	if err := checkHeader2(b); err != nil {
		return 0, err
	}
	if !allZero(b[12:]) {
		return 0, fmt.Errorf("%w: output fields must be zero", ErrInvalid)
	}
	return le.Uint32(b[8:]), nil
}

// EncodePackReply writes p over the request bytes b (the node's side).
func EncodePackReply(b []byte, p PackInfo) error {
	if len(b) != PackSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), PackSize)
	}
	if len(p.Path) >= PackPathMaxV2 || strings.IndexByte(p.Path, 0) >= 0 {
		return fmt.Errorf("%w: pack path of %d bytes does not fit in %d", ErrInvalid, len(p.Path), PackPathMaxV2)
	}
	le.PutUint32(b[12:], p.NPacks)
	le.PutUint64(b[16:], p.Generation)
	le.PutUint64(b[24:], p.Size)
	le.PutUint32(b[32:], p.Flags)
	le.PutUint32(b[36:], uint32(len(p.Path)))
	clear(b[40:])
	copy(b[40:], p.Path)
	return nil
}

// DecodePackReply parses a reply (the caller's side).
func DecodePackReply(b []byte) (PackInfo, error) {
	if len(b) != PackSize {
		return PackInfo{}, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), PackSize)
	}
	p := PackInfo{NPacks: le.Uint32(b[12:]), Generation: le.Uint64(b[16:]), Size: le.Uint64(b[24:]), Flags: le.Uint32(b[32:])}
	n := le.Uint32(b[36:])
	if n >= PackPathMaxV2 || b[40+n] != 0 {
		return PackInfo{}, fmt.Errorf("%w: path length %d", ErrInvalid, n)
	}
	if p.Flags&^(PackWholeFile|PackChecked) != 0 {
		return PackInfo{}, fmt.Errorf("%w: unknown pack flags %#x", ErrInvalid, p.Flags)
	}
	p.Path = string(b[40 : 40+n])
	return p, nil
}

// ---- KYLIX_IOC_MAKE_LOCAL ----

// MakeLocalRequest is struct kylix_make_local.
type MakeLocalRequest struct {
	Offset uint64
	Length uint64 // 0: to the end of the file
}

// EncodeMakeLocal makes the bytes of a request (the caller's side).
func EncodeMakeLocal(r MakeLocalRequest) []byte {
	b := make([]byte, MakeLocalSize)
	putHeader2(b)
	le.PutUint64(b[8:], r.Offset)
	le.PutUint64(b[16:], r.Length)
	return b
}

// DecodeMakeLocal checks a struct kylix_make_local (the node's side).
func DecodeMakeLocal(b []byte) (MakeLocalRequest, error) {
	if len(b) != MakeLocalSize {
		return MakeLocalRequest{}, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), MakeLocalSize)
	}
	if err := checkHeader2(b); err != nil {
		return MakeLocalRequest{}, err
	}
	r := MakeLocalRequest{Offset: le.Uint64(b[8:]), Length: le.Uint64(b[16:])}
	if r.Offset > 1<<62 || r.Length > 1<<62 {
		return MakeLocalRequest{}, fmt.Errorf("%w: range [%d, +%d) overflows", ErrInvalid, r.Offset, r.Length)
	}
	return r, nil
}
