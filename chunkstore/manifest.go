package chunkstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"
)

// Limits enforced when decoding manifests, so that a damaged or hostile
// manifest cannot make the decoder allocate without bound.
const (
	MaxNameLen = 255 // bytes in one path component
	// MaxPathLen bounds a namespace path. It is not PATH_MAX: the kernel
	// bounds each path a system call names, but a process whose working
	// directory is deep in the mount names paths relative to it, and ext4
	// has no bound on a file's depth, so neither has the mount short of
	// this guard against runaway input.
	MaxPathLen = 1 << 16
	// MaxSymlinkLen bounds a symlink's target (the kernel's PATH_MAX).
	MaxSymlinkLen = 4096
	MaxChunkLen   = 1 << 30 // bytes in one chunk
	maxFileSize   = 1 << 50
	manifestFile  = "KXF1"
	// manifestFileCoded is a file manifest that also names the stripes
	// its chunks are coded in (cold data, docs/design/erasure.md); a file
	// without stripes keeps the KXF1 encoding, and so its id.
	manifestFileCoded = "KXF2"
	// manifestDirV1 is the directory encoding before owners were stored:
	// still decoded (its entries' owners are OwnerUnknown), and still the
	// one encoding of the empty directory, whose ID is well known and
	// never stored as an object.
	manifestDirV1 = "KXD1"
	// manifestDir is the encoding written now: each entry also carries
	// its owner, group and Unix mode (permission and special bits).
	manifestDir = "KXD2"
)

// OwnerUnknown is the UID and GID of entries recorded before owners were
// stored (KXD1 manifests). The mount shows them as owned by the node's own
// user and group, as it showed everything then; export leaves their owner
// alone. It is (uid_t)-1, which no account can have: chown(2) reads it as
// "no change".
const OwnerUnknown = ^uint32(0)

// Special mode bits kept per entry, in Go's FileMode encoding.
const modeSpecial = fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// EntryModeMask is what an Entry's Mode may hold: permission bits plus
// setuid, setgid and sticky.
const EntryModeMask = fs.ModePerm | modeSpecial

// UnixMode returns m's permission and special bits as a Unix mode
// (S_ISUID 0o4000, S_ISGID 0o2000, S_ISVTX 0o1000, rwx bits), the form
// stat(2) and the directory manifest use.
func UnixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// ModeFromUnix returns the FileMode of the low 12 bits of a Unix mode
// (file type bits are ignored).
func ModeFromUnix(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Format says how a file was chunked.
type Format uint8

const (
	// FormatOpaque files are cut by content-defined chunking.
	FormatOpaque Format = 0
	// FormatSafetensors files are cut at tensor boundaries.
	FormatSafetensors Format = 1
)

func (f Format) String() string {
	switch f {
	case FormatOpaque:
		return "opaque"
	case FormatSafetensors:
		return "safetensors"
	}
	return fmt.Sprintf("format(%d)", uint8(f))
}

// ChunkRef is one chunk of a file, in file order.
type ChunkRef struct {
	ID  ID
	Len uint32
}

// FileManifest is the content of a file: its chunks in order. It holds no
// location and no metadata (mode, times), so identical content anywhere has
// one manifest and one ID.
type FileManifest struct {
	Size   int64
	Format Format
	Chunks []ChunkRef
	// Stripes are the stripes the file's chunks are coded in, when the
	// file is cold (docs/design/erasure.md, "Stripes in the metadata"):
	// each names at least one of Chunks (and may name chunks of other
	// files: a stripe is shared by every file that has a chunk in it).
	// Every shard of each is reachable from the file for garbage
	// collection. Empty for a file kept by replicas. Encode orders them
	// by their encoding; each must pass Stripe.Check.
	Stripes []*Stripe
}

// Encode returns the manifest's canonical bytes. It panics on a stripe
// that fails Stripe.Check (a caller's bug: SetFileStripes checks them).
func (m *FileManifest) Encode() []byte {
	b := make([]byte, 0, 16+len(m.Chunks)*(IDSize+3))
	magic := manifestFile
	if len(m.Stripes) > 0 {
		magic = manifestFileCoded
	}
	b = append(b, magic...)
	b = append(b, byte(m.Format))
	b = binary.AppendUvarint(b, uint64(m.Size))
	b = binary.AppendUvarint(b, uint64(len(m.Chunks)))
	for _, c := range m.Chunks {
		b = append(b, c.ID[:]...)
		b = binary.AppendUvarint(b, uint64(c.Len))
	}
	if len(m.Stripes) == 0 {
		return b
	}
	enc := make([][]byte, len(m.Stripes))
	for i, r := range m.Stripes {
		e, err := r.MarshalBinary()
		if err != nil {
			panic("chunkstore: FileManifest.Encode: " + err.Error())
		}
		enc[i] = e
	}
	slices.SortFunc(enc, bytes.Compare)
	b = binary.AppendUvarint(b, uint64(len(enc)))
	for _, e := range enc {
		b = binary.AppendUvarint(b, uint64(len(e)))
		b = append(b, e...)
	}
	return b
}

// Coded reports whether chunk id of the file is coded in one of its
// stripes, and in which (nil: kept by replicas).
func (m *FileManifest) Coded(id ID) *Stripe {
	for _, r := range m.Stripes {
		for _, c := range r.Chunks {
			if c.ID == id {
				return r
			}
		}
	}
	return nil
}

// DecodeFileManifest parses bytes made by Encode. It checks that the chunk
// lengths add up to the size and, for a coded file, that its stripes are
// canonical, in order, unique, and each names a chunk of the file.
func DecodeFileManifest(b []byte) (*FileManifest, error) {
	d := decoder{b: b}
	coded := false
	switch {
	case d.magic(manifestFile):
	case d.magic(manifestFileCoded):
		coded = true
	default:
		return nil, fmt.Errorf("file manifest: bad magic: %w", ErrCorrupt)
	}
	m := &FileManifest{Format: Format(d.byte())}
	size := d.uvarint()
	n := d.uvarint()
	if d.err == nil && (size > maxFileSize || n > uint64(len(d.b))/(IDSize+1)) {
		return nil, fmt.Errorf("file manifest: size %d with %d chunks is out of range: %w", size, n, ErrCorrupt)
	}
	m.Size = int64(size)
	m.Chunks = make([]ChunkRef, 0, n)
	var total uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		var c ChunkRef
		copy(c.ID[:], d.bytes(IDSize))
		l := d.uvarint()
		if l == 0 || l > MaxChunkLen {
			return nil, fmt.Errorf("file manifest: chunk %d length %d: %w", i, l, ErrCorrupt)
		}
		c.Len = uint32(l)
		total += l
		m.Chunks = append(m.Chunks, c)
	}
	if coded && d.err == nil {
		if err := m.decodeStripes(&d); err != nil {
			return nil, err
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("file manifest: %w", d.err)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("file manifest: %d trailing bytes: %w", len(d.b), ErrCorrupt)
	}
	if total != size {
		return nil, fmt.Errorf("file manifest: chunks hold %d bytes, size says %d: %w", total, size, ErrCorrupt)
	}
	if m.Format > FormatSafetensors {
		return nil, fmt.Errorf("file manifest: unknown format %d: %w", m.Format, ErrCorrupt)
	}
	return m, nil
}

// decodeStripes reads a coded manifest's stripes: at most one per chunk,
// each canonical, strictly in order, and naming a chunk of the file.
func (m *FileManifest) decodeStripes(d *decoder) error {
	n := d.uvarint()
	if d.err == nil && (n == 0 || n > uint64(len(m.Chunks))) {
		return fmt.Errorf("file manifest: %d stripes for %d chunks: %w", n, len(m.Chunks), ErrCorrupt)
	}
	mine := make(map[ID]bool, len(m.Chunks))
	for _, c := range m.Chunks {
		mine[c.ID] = true
	}
	var prev []byte
	for i := uint64(0); i < n && d.err == nil; i++ {
		l := d.uvarint()
		if l > maxStripeLen {
			return fmt.Errorf("file manifest: stripe %d of %d bytes: %w", i, l, ErrCorrupt)
		}
		e := d.bytes(int(l))
		if d.err != nil {
			break
		}
		r, err := ParseStripe(e)
		if err != nil {
			return fmt.Errorf("file manifest: stripe %d: %w: %w", i, err, ErrCorrupt)
		}
		if prev != nil && bytes.Compare(prev, e) >= 0 {
			return fmt.Errorf("file manifest: stripes out of order or repeated: %w", ErrCorrupt)
		}
		prev = e
		if !slices.ContainsFunc(r.Chunks, func(c ChunkRef) bool { return mine[c.ID] }) {
			return fmt.Errorf("file manifest: stripe %d names no chunk of the file: %w", i, ErrCorrupt)
		}
		m.Stripes = append(m.Stripes, r)
	}
	return nil
}

// Kind is the type of a directory entry.
type Kind uint8

// Entry kinds.
const (
	KindFile    Kind = 1
	KindDir     Kind = 2
	KindSymlink Kind = 3
	// Special files: only their metadata is stored (mode, owner, group,
	// mtime, and Rdev for devices); the kernel does their I/O
	// (docs/design/fs.md, "Special files").
	KindFifo     Kind = 4
	KindSocket   Kind = 5
	KindCharDev  Kind = 6
	KindBlockDev Kind = 7
	// KindHardlink is one name of a link set (hard links): it holds
	// only the set's number (Entry.Link); the set's one entry, with the
	// content, owner, mode and link count, is in the link table
	// (docs/design/hardlinks.md). Lookups return that entry under the
	// name, never a KindHardlink.
	KindHardlink Kind = 8
)

// Special reports whether k is a fifo, socket or device node.
func (k Kind) Special() bool { return k >= KindFifo && k <= KindBlockDev }

// IsDevice reports whether k is a character or block device node, the
// kinds that carry an Rdev.
func (k Kind) IsDevice() bool { return k == KindCharDev || k == KindBlockDev }

func (k Kind) String() string {
	switch k {
	case KindFile:
		return "file"
	case KindDir:
		return "dir"
	case KindSymlink:
		return "symlink"
	case KindFifo:
		return "fifo"
	case KindSocket:
		return "socket"
	case KindCharDev:
		return "char-device"
	case KindBlockDev:
		return "block-device"
	case KindHardlink:
		return "hardlink"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Entry is one name in a directory. Owner, group and mode are what
// stat(2) shows and the kernel enforces on the mount; they live here, not
// in the file's manifest, so changing them never writes file content.
type Entry struct {
	Name string
	Kind Kind
	// Mode holds the permission bits and fs.ModeSetuid, fs.ModeSetgid,
	// fs.ModeSticky (EntryModeMask); other bits are not stored.
	Mode fs.FileMode
	// UID and GID own the entry; OwnerUnknown for entries recorded before
	// owners were stored.
	UID   uint32
	GID   uint32
	Size  int64 // file size; 0 for directories; len(Target) for symlinks
	MTime int64 // Unix nanoseconds
	// CTime is the last change of the entry's metadata or content (Unix
	// nanoseconds), what stat(2) shows as st_ctime; 0 for entries that
	// never recorded one (st_ctime is then MTime).
	CTime int64
	// ATime is the access time last set (utimensat); 0 when none was
	// (st_atime is then MTime). Reads do not move it (as noatime).
	ATime  int64
	ID     ID     // FileManifest (files) or DirManifest (directories)
	Target string // symlink target
	// Rdev is a device node's device number, as Linux's dev_t
	// (unix.Mkdev); 0 for every other kind.
	Rdev uint64
	// Link is the link set a KindHardlink name belongs to, and, in the
	// entry a lookup returns for such a name, the set it was found
	// through; 0 for a name that is its file's only one.
	Link uint64
	// Nlink is the number of names of a link-table entry (stored), and
	// of the entry a lookup returns for a name of a link set; 0
	// otherwise.
	Nlink uint32
	// HLC orders concurrent updates of this name from different nodes: the
	// larger wins. Deleted entries are tombstones kept so that a merge does
	// not resurrect what was removed.
	HLC     HLC
	Deleted bool
}

// DirManifest is a directory: entries sorted by name, names unique.
type DirManifest struct {
	Entries []Entry
}

const (
	entryDeleted = 1
	// entryNlink: a link count follows the entry (link-table entries).
	entryNlink = 2
	// entryCtime: a change time follows the entry (before the link
	// count).
	entryCtime = 4
	// entryAtime: an access time follows (after the change time).
	entryAtime = 8
)

// Encode returns the manifest's canonical bytes (KXD2; the empty directory
// keeps its KXD1 bytes, so its well-known ID never changed). Entries must
// be sorted by name (see Put).
func (m *DirManifest) Encode() []byte {
	var buf bytes.Buffer
	if len(m.Entries) == 0 {
		buf.WriteString(manifestDirV1)
		buf.WriteByte(0)
		return buf.Bytes()
	}
	buf.WriteString(manifestDir)
	var tmp [binary.MaxVarintLen64]byte
	put := func(v uint64) { buf.Write(tmp[:binary.PutUvarint(tmp[:], v)]) }
	put(uint64(len(m.Entries)))
	for _, e := range m.Entries {
		put(uint64(len(e.Name)))
		buf.WriteString(e.Name)
		buf.WriteByte(byte(e.Kind))
		var flags byte
		if e.Deleted {
			flags |= entryDeleted
		}
		if e.Nlink != 0 {
			flags |= entryNlink
		}
		if e.CTime != 0 {
			flags |= entryCtime
		}
		if e.ATime != 0 {
			flags |= entryAtime
		}
		buf.WriteByte(flags)
		put(uint64(UnixMode(e.Mode)))
		put(uint64(e.UID))
		put(uint64(e.GID))
		put(uint64(e.Size))
		buf.Write(tmp[:binary.PutVarint(tmp[:], e.MTime)])
		put(uint64(e.HLC))
		switch e.Kind {
		case KindFile, KindDir:
			buf.Write(e.ID[:])
		case KindSymlink:
			put(uint64(len(e.Target)))
			buf.WriteString(e.Target)
		case KindCharDev, KindBlockDev:
			put(e.Rdev)
		case KindHardlink:
			put(e.Link)
		}
		if e.CTime != 0 {
			buf.Write(tmp[:binary.PutVarint(tmp[:], e.CTime)])
		}
		if e.ATime != 0 {
			buf.Write(tmp[:binary.PutVarint(tmp[:], e.ATime)])
		}
		if e.Nlink != 0 {
			put(uint64(e.Nlink))
		}
	}
	return buf.Bytes()
}

// DecodeDirManifest parses bytes made by Encode, rejecting bad names, unsorted
// or duplicate entries, unknown kinds and truncated data. Special files
// (KindFifo and the others) are KXD2 only: a fifo or socket stores nothing
// after its HLC, a device its Rdev; so are hard-link names (their Link) and
// link-table entries (flag entryNlink: their Nlink last). It also reads the
// KXD1 encoding written before owners were stored: its entries get
// OwnerUnknown as UID and GID and keep their mode. Every accepted KXD2
// input is byte for byte what Encode makes of the result.
func DecodeDirManifest(b []byte) (*DirManifest, error) {
	d := decoder{b: b}
	v2 := d.magic(manifestDir)
	if !v2 && !d.magic(manifestDirV1) {
		return nil, fmt.Errorf("dir manifest: bad magic: %w", ErrCorrupt)
	}
	n := d.uvarint()
	if v2 && n == 0 && d.err == nil {
		// The empty directory has one encoding: KXD1's.
		return nil, fmt.Errorf("dir manifest: empty KXD2 manifest: %w", ErrCorrupt)
	}
	// Each entry takes at least 8 bytes, so a count larger than that is a lie.
	if n > uint64(len(d.b))/8 {
		return nil, fmt.Errorf("dir manifest: %d entries in %d bytes: %w", n, len(d.b), ErrCorrupt)
	}
	m := &DirManifest{Entries: make([]Entry, 0, n)}
	for i := uint64(0); i < n && d.err == nil; i++ {
		var e Entry
		nl := d.uvarint()
		if nl == 0 || nl > MaxNameLen {
			return nil, fmt.Errorf("dir manifest: entry %d: name length %d: %w", i, nl, ErrCorrupt)
		}
		e.Name = string(d.bytes(int(nl)))
		e.Kind = Kind(d.byte())
		flags := d.byte()
		e.Deleted = flags&entryDeleted != 0
		mode := d.uvarint()
		uid, gid := uint64(OwnerUnknown), uint64(OwnerUnknown)
		if v2 {
			uid, gid = d.uvarint(), d.uvarint()
		}
		e.Size = int64(d.uvarint())
		e.MTime = d.varint()
		e.HLC = HLC(d.uvarint())
		if d.err != nil {
			break
		}
		if err := checkName(e.Name); err != nil {
			return nil, fmt.Errorf("dir manifest: entry %d: %w", i, err)
		}
		if flags&^(entryDeleted|entryNlink|entryCtime|entryAtime) != 0 || uid > math.MaxUint32 || gid > math.MaxUint32 || e.Size < 0 || e.Size > maxFileSize {
			return nil, fmt.Errorf("dir manifest: entry %q: bad flags, owner or size: %w", e.Name, ErrCorrupt)
		}
		e.UID, e.GID = uint32(uid), uint32(gid)
		if v2 {
			if mode > 0o7777 {
				return nil, fmt.Errorf("dir manifest: entry %q: mode %#o: %w", e.Name, mode, ErrCorrupt)
			}
			e.Mode = ModeFromUnix(uint32(mode))
		} else {
			// KXD1 wrote Go's FileMode: permission bits and Go's
			// setuid, setgid and sticky bits, nothing else.
			if mode&^uint64(EntryModeMask) != 0 {
				return nil, fmt.Errorf("dir manifest: entry %q: mode %#x: %w", e.Name, mode, ErrCorrupt)
			}
			e.Mode = fs.FileMode(mode)
		}
		if !v2 && (e.Kind.Special() || e.Kind == KindHardlink || flags&(entryNlink|entryCtime|entryAtime) != 0) {
			return nil, fmt.Errorf("dir manifest: entry %q: %v in a KXD1 manifest: %w", e.Name, e.Kind, ErrCorrupt)
		}
		switch e.Kind {
		case KindFile, KindDir:
			copy(e.ID[:], d.bytes(IDSize))
		case KindSymlink:
			tl := d.uvarint()
			if tl == 0 || tl > MaxSymlinkLen {
				return nil, fmt.Errorf("dir manifest: entry %q: symlink length %d: %w", e.Name, tl, ErrCorrupt)
			}
			e.Target = string(d.bytes(int(tl)))
		case KindFifo, KindSocket:
		case KindCharDev, KindBlockDev:
			e.Rdev = d.uvarint()
		case KindHardlink:
			if e.Link = d.uvarint(); e.Link == 0 && d.err == nil {
				return nil, fmt.Errorf("dir manifest: entry %q: link set 0: %w", e.Name, ErrCorrupt)
			}
		default:
			return nil, fmt.Errorf("dir manifest: entry %q: unknown kind %d: %w", e.Name, e.Kind, ErrCorrupt)
		}
		if flags&entryCtime != 0 {
			if e.CTime = d.varint(); e.CTime == 0 && d.err == nil {
				return nil, fmt.Errorf("dir manifest: entry %q: change time 0 behind its flag: %w", e.Name, ErrCorrupt)
			}
		}
		if flags&entryAtime != 0 {
			if e.ATime = d.varint(); e.ATime == 0 && d.err == nil {
				return nil, fmt.Errorf("dir manifest: entry %q: access time 0 behind its flag: %w", e.Name, ErrCorrupt)
			}
		}
		if flags&entryNlink != 0 {
			n := d.uvarint()
			if e.Kind == KindDir || e.Kind == KindHardlink || (d.err == nil && (n == 0 || n > math.MaxUint32)) {
				return nil, fmt.Errorf("dir manifest: entry %q: %v with link count %d: %w", e.Name, e.Kind, n, ErrCorrupt)
			}
			e.Nlink = uint32(n)
		}
		if i > 0 && m.Entries[i-1].Name >= e.Name {
			return nil, fmt.Errorf("dir manifest: entry %q out of order or duplicate: %w", e.Name, ErrCorrupt)
		}
		m.Entries = append(m.Entries, e)
	}
	if d.err != nil {
		return nil, fmt.Errorf("dir manifest: %w", d.err)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("dir manifest: %d trailing bytes: %w", len(d.b), ErrCorrupt)
	}
	return m, nil
}

// Find returns the index of name in m and whether it is there.
func (m *DirManifest) Find(name string) (int, bool) {
	lo, hi := 0, len(m.Entries)
	for lo < hi {
		mid := (lo + hi) / 2
		if m.Entries[mid].Name < name {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(m.Entries) && m.Entries[lo].Name == name
}

// Put inserts or replaces e, keeping entries sorted.
func (m *DirManifest) Put(e Entry) {
	i, ok := m.Find(e.Name)
	if ok {
		m.Entries[i] = e
		return
	}
	m.Entries = append(m.Entries, Entry{})
	copy(m.Entries[i+1:], m.Entries[i:])
	m.Entries[i] = e
}

// Live returns the entries that are not tombstones.
func (m *DirManifest) Live() []Entry {
	out := make([]Entry, 0, len(m.Entries))
	for _, e := range m.Entries {
		if !e.Deleted {
			out = append(out, e)
		}
	}
	return out
}

// checkName validates one path component.
func checkName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("name %q: %w", name, ErrInvalidPath)
	case len(name) > MaxNameLen:
		return fmt.Errorf("name of %d bytes (max %d): %w", len(name), MaxNameLen, ErrInvalidPath)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("name %q contains '/' or NUL: %w", name, ErrInvalidPath)
	}
	return nil
}

// SplitPath cleans a namespace path ("models/llama", "/models/llama/") into
// its components. The root is "" or "/" and has no components. It rejects
// ".." and every other way out of the namespace.
func SplitPath(p string) ([]string, error) {
	if len(p) > MaxPathLen {
		return nil, fmt.Errorf("path of %d bytes (max %d): %w", len(p), MaxPathLen, ErrInvalidPath)
	}
	var parts []string
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." {
			continue
		}
		if err := checkName(c); err != nil {
			return nil, fmt.Errorf("path %q: %w", p, err)
		}
		parts = append(parts, c)
	}
	return parts, nil
}

// CleanPath returns the canonical form of a namespace path ("a/b", "" for
// the root).
func CleanPath(p string) (string, error) {
	parts, err := SplitPath(p)
	if err != nil {
		return "", err
	}
	return strings.Join(parts, "/"), nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("truncated: %w", ErrCorrupt)
	}
	d.b = nil
}

func (d *decoder) magic(m string) bool {
	if len(d.b) < len(m) || string(d.b[:len(m)]) != m {
		return false
	}
	d.b = d.b[len(m):]
	return true
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes(n int) []byte {
	if n < 0 || len(d.b) < n {
		d.fail()
		return make([]byte, max(n, 0))
	}
	s := d.b[:n]
	d.b = d.b[n:]
	return s
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != uvarintLen(v) {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 || n != varintLen(v) {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Manifests are content-addressed, so each has exactly one encoding: the
// decoder rejects varints that are not minimal.
func uvarintLen(v uint64) int {
	var tmp [binary.MaxVarintLen64]byte
	return binary.PutUvarint(tmp[:], v)
}

func varintLen(v int64) int {
	var tmp [binary.MaxVarintLen64]byte
	return binary.PutVarint(tmp[:], v)
}
