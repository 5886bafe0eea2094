package chunkstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/kylix/kylix/chunkstore/internal/vfs"
)

// The metadata log is the durable truth behind the index (docs/design/index.md).
// It is an append-only file in the packs directory, packs/<gen>.meta:
//
//	header: "KYXMETA1"
//	frame:  payload length u32 | CRC-32C of payload u32 | payload
//	payload: one or more records, each a kind byte and its fields
//
// A frame is one commit: it is appended and fdatasynced before the bbolt
// transaction that caches the same records, so the index can always be
// recreated by replaying the log, and a frame torn by a crash fails its
// checksum and is cut off. Chunk data never carries headers: an exclusive
// pack stays exactly its file's bytes, which FUSE passthrough needs.
const logMagic = "KYXMETA1"

// maxFrame bounds one frame; anything larger is damage, not a commit.
const maxFrame = 1 << 30

// snapshotFrame is the payload size at which a snapshot starts a new frame.
const snapshotFrame = 4 << 20

type recKind uint8

// Record kinds. Values are on disk: never renumber.
const (
	// recIntent: a pack file is about to be created. Written and synced
	// before the file exists, so a pack with an intent and no recPack was
	// begun and never committed, and only such a pack is removed at open.
	recIntent recKind = 1
	recPack   recKind = 2 // pack committed size and flags
	recChunk  recKind = 3 // chunk location (first committed location wins)
	recObject recKind = 4 // a manifest's bytes (its ID is their hash)
	recHead   recKind = 5 // head name, root, HLC (the newest HLC wins)
	// Removals made by GC. recDelPack turns the pack back into an
	// intent (a file holding nothing committed) until its file is gone.
	recDelChunk  recKind = 6
	recDelObject recKind = 7
	recDelPack   recKind = 8
	// recAbandon: a pack holding nothing committed (an intent) was
	// removed from disk.
	recAbandon recKind = 9
	// recRelocate: GC's compaction copied a live chunk into another pack
	// (docs/design/gc.md); the chunk's location becomes loc. Logged in the
	// same frame as the new pack's recPack and the old pack's recDelPack.
	recRelocate recKind = 10
)

// record is one metadata change. Which fields are used depends on kind.
type record struct {
	kind recKind
	pack uint64
	info packInfo
	id   ID
	loc  Location
	obj  []byte
	head Head
}

func appendRecord(b []byte, r record) []byte {
	b = append(b, byte(r.kind))
	switch r.kind {
	case recIntent:
		b = binary.BigEndian.AppendUint64(b, r.pack)
		b = append(b, r.info.Flags)
	case recPack:
		b = binary.BigEndian.AppendUint64(b, r.pack)
		b = append(b, r.info.encode()...)
	case recChunk, recRelocate:
		b = append(b, r.id[:]...)
		b = append(b, r.loc.encode()...)
	case recObject:
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.obj)))
		b = append(b, r.obj...)
	case recHead:
		b = binary.BigEndian.AppendUint16(b, uint16(len(r.head.Name)))
		b = append(b, r.head.Name...)
		b = append(b, r.head.encode()...)
	case recDelChunk, recDelObject:
		b = append(b, r.id[:]...)
	case recDelPack, recAbandon:
		b = binary.BigEndian.AppendUint64(b, r.pack)
	}
	return b
}

func decodeRecords(p []byte, fn func(record) error) error {
	short := fmt.Errorf("metadata record cut short: %w", ErrCorrupt)
	for len(p) > 0 {
		r := record{kind: recKind(p[0])}
		p = p[1:]
		need := func(n int) bool { return len(p) >= n }
		switch r.kind {
		case recIntent:
			if !need(9) {
				return short
			}
			r.pack, r.info.Flags = binary.BigEndian.Uint64(p), p[8]
			p = p[9:]
		case recPack:
			if !need(17) {
				return short
			}
			r.pack = binary.BigEndian.Uint64(p)
			pi, err := decodePackInfo(p[8:17])
			if err != nil {
				return err
			}
			r.info = pi
			p = p[17:]
		case recChunk, recRelocate:
			if !need(IDSize + 20) {
				return short
			}
			copy(r.id[:], p)
			l, err := decodeLocation(p[IDSize : IDSize+20])
			if err != nil {
				return err
			}
			r.loc = l
			p = p[IDSize+20:]
		case recObject:
			if !need(4) {
				return short
			}
			n := int(binary.BigEndian.Uint32(p))
			if !need(4 + n) {
				return short
			}
			r.obj = p[4 : 4+n]
			r.id = Sum(r.obj)
			p = p[4+n:]
		case recHead:
			if !need(2) {
				return short
			}
			n := int(binary.BigEndian.Uint16(p))
			if !need(2 + n + IDSize + 8) {
				return short
			}
			h, err := decodeHead(string(p[2:2+n]), p[2+n:2+n+IDSize+8])
			if err != nil {
				return err
			}
			r.head = h
			p = p[2+n+IDSize+8:]
		case recDelChunk, recDelObject:
			if !need(IDSize) {
				return short
			}
			copy(r.id[:], p)
			p = p[IDSize:]
		case recDelPack, recAbandon:
			if !need(8) {
				return short
			}
			r.pack = binary.BigEndian.Uint64(p)
			p = p[8:]
		default:
			return fmt.Errorf("metadata record of unknown kind %d: %w", r.kind, ErrCorrupt)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func frame(payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(b, uint32(len(payload)))
	binary.BigEndian.PutUint32(b[4:], crc32.Checksum(payload, crcTable))
	return append(b, payload...)
}

// applyRecord makes r's change in the index. Replaying a log prefix that is
// already applied changes nothing, so replay after a crash at any point is
// safe.
func applyRecord(tx *bolt.Tx, r record) error {
	switch r.kind {
	case recIntent:
		if tx.Bucket(bucketPacks).Get(packKey(r.pack)) != nil {
			return nil
		}
		return tx.Bucket(bucketIntents).Put(packKey(r.pack), []byte{r.info.Flags})
	case recPack:
		packs := tx.Bucket(bucketPacks)
		k := packKey(r.pack)
		pi := r.info
		if old := packs.Get(k); old != nil {
			o, err := decodePackInfo(old)
			if err != nil {
				return err
			}
			pi.Size = max(pi.Size, o.Size)
		}
		if err := tx.Bucket(bucketIntents).Delete(k); err != nil {
			return err
		}
		return packs.Put(k, pi.encode())
	case recChunk:
		b := tx.Bucket(bucketChunks)
		if b.Get(r.id[:]) != nil {
			return nil // another importer committed the same chunk first
		}
		return b.Put(r.id[:], r.loc.encode())
	case recObject:
		b := tx.Bucket(bucketObjects)
		if b.Get(r.id[:]) != nil {
			return nil
		}
		return b.Put(r.id[:], r.obj)
	case recHead:
		b := tx.Bucket(bucketHeads)
		if old := b.Get([]byte(r.head.Name)); old != nil {
			o, err := decodeHead(r.head.Name, old)
			if err != nil {
				return err
			}
			if o.HLC > r.head.HLC {
				return nil
			}
		}
		return b.Put([]byte(r.head.Name), r.head.encode())
	case recRelocate:
		// Unlike recChunk, the new location replaces the old one. A chunk
		// the index no longer has stays absent (frames apply in log order,
		// so this happens only on a replay that already saw its removal).
		b := tx.Bucket(bucketChunks)
		if b.Get(r.id[:]) == nil {
			return nil
		}
		return b.Put(r.id[:], r.loc.encode())
	case recDelChunk:
		return tx.Bucket(bucketChunks).Delete(r.id[:])
	case recDelObject:
		return tx.Bucket(bucketObjects).Delete(r.id[:])
	case recDelPack:
		// The pack's file is about to be removed: it becomes a pack that
		// holds nothing committed, like one begun and never committed, so
		// a crash before the removal is finished by the next open.
		if err := tx.Bucket(bucketPacks).Delete(packKey(r.pack)); err != nil {
			return err
		}
		return tx.Bucket(bucketIntents).Put(packKey(r.pack), []byte{0})
	case recAbandon:
		return tx.Bucket(bucketIntents).Delete(packKey(r.pack))
	}
	return fmt.Errorf("metadata record of unknown kind %d: %w", r.kind, ErrCorrupt)
}

// logState is where the index stands in the log: the log generation and the
// offset up to which its frames are applied. Kept in the meta bucket, written
// in the same transaction as the records it covers.
type logState struct {
	gen uint64
	off int64
}

var keyLogState = []byte("log")

func getLogState(tx *bolt.Tx) (logState, bool, error) {
	v := tx.Bucket(bucketMeta).Get(keyLogState)
	if v == nil {
		return logState{}, false, nil
	}
	if len(v) != 16 {
		return logState{}, false, fmt.Errorf("log state of %d bytes: %w", len(v), ErrCorrupt)
	}
	return logState{gen: binary.BigEndian.Uint64(v), off: int64(binary.BigEndian.Uint64(v[8:]))}, true, nil
}

func putLogState(tx *bolt.Tx, st logState) error {
	v := binary.BigEndian.AppendUint64(nil, st.gen)
	v = binary.BigEndian.AppendUint64(v, uint64(st.off))
	return tx.Bucket(bucketMeta).Put(keyLogState, v)
}

func logName(gen uint64) string { return fmt.Sprintf("%016x.meta", gen) }

func parseLogName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, ".meta")
	if !ok || len(hex) != 16 {
		return 0, false
	}
	g, err := strconv.ParseUint(hex, 16, 64)
	return g, err == nil && g > 0
}

// metaLog is the open, current log generation.
type metaLog struct {
	fs   vfs.FS
	dir  string // the packs directory
	gen  uint64
	f    vfs.File
	size int64
	// unapplied holds records appended (intents) but not yet in the index;
	// the next commit applies them with its own.
	unapplied []record
	// err is sticky: after a failed sync the file's state in the kernel is
	// unknown (a later fsync may report success for lost pages), so no
	// more commits are accepted until the store is reopened.
	err error
}

func (l *metaLog) path() string { return filepath.Join(l.dir, logName(l.gen)) }

// append writes payload as one frame and makes it durable. On failure the
// log is cut back to where it was, so no torn frame sits before later ones.
func (l *metaLog) append(payload []byte) (start int64, err error) {
	if l.err != nil {
		return 0, fmt.Errorf("metadata log failed earlier (reopen the store): %w", l.err)
	}
	start = l.size
	fr := frame(payload)
	n, err := l.f.WriteAt(fr, start)
	if err == nil && n != len(fr) {
		err = io.ErrShortWrite
	}
	if err == nil {
		err = l.f.Sync()
		if err != nil {
			l.err = err
		}
	}
	if err != nil {
		l.undo(start)
		return 0, fmt.Errorf("append to metadata log %s: %w", l.path(), err)
	}
	l.size = start + int64(len(fr))
	return start, nil
}

// undo cuts the log back to off.
func (l *metaLog) undo(off int64) {
	if err := l.f.Truncate(off); err != nil {
		l.err = errors.Join(l.err, err)
		return
	}
	if err := l.f.Sync(); err != nil {
		l.err = errors.Join(l.err, err)
	}
	l.size = off
}

func (l *metaLog) close() error {
	if l == nil || l.f == nil {
		return nil
	}
	return l.f.Close()
}

// readFrames reads the frames of the log file at path from offset from and
// calls fn with each payload and the offset after it. It returns the offset
// of the end of the last good frame and, when it stopped early, why.
func readFrames(fsys vfs.FS, path string, from int64, fn func(payload []byte, end int64) error) (good int64, bad error, err error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, nil, err
	}
	size := st.Size()
	hdr := make([]byte, len(logMagic))
	if _, err := f.ReadAt(hdr, 0); err != nil || string(hdr) != logMagic {
		return 0, fmt.Errorf("no metadata log header: %w", ErrCorrupt), nil
	}
	off := max(from, int64(len(logMagic)))
	var fh [8]byte
	for off < size {
		if size-off < 8 {
			return off, fmt.Errorf("frame header cut short at offset %d: %w", off, ErrCorrupt), nil
		}
		if _, err := f.ReadAt(fh[:], off); err != nil {
			return off, nil, err
		}
		n := int64(binary.BigEndian.Uint32(fh[:]))
		if n > maxFrame || off+8+n > size {
			return off, fmt.Errorf("frame at offset %d cut short or damaged: %w", off, ErrCorrupt), nil
		}
		p := make([]byte, n)
		if _, err := f.ReadAt(p, off+8); err != nil {
			return off, nil, err
		}
		if crc32.Checksum(p, crcTable) != binary.BigEndian.Uint32(fh[4:]) {
			return off, fmt.Errorf("frame at offset %d fails its checksum: %w", off, ErrCorrupt), nil
		}
		if err := fn(p, off+8+n); err != nil {
			return off, nil, err
		}
		off += 8 + n
	}
	return off, nil, nil
}

// scanLogs lists the log generations in the packs directory, ascending.
func scanLogs(fsys vfs.FS, dir string) ([]uint64, error) {
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var gens []uint64
	for _, e := range ents {
		if g, ok := parseLogName(e.Name()); ok {
			gens = append(gens, g)
		}
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i] < gens[j] })
	return gens, nil
}

// openLogFile opens generation gen for appending.
func openLogFile(fsys vfs.FS, dir string, gen uint64) (*metaLog, error) {
	l := &metaLog{fs: fsys, dir: dir, gen: gen}
	f, err := fsys.OpenFile(l.path(), os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open metadata log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open metadata log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return l, nil
}

// snapshotRecords calls fn with records that recreate the index's content.
func snapshotRecords(tx *bolt.Tx, fn func(record) error) error {
	if err := tx.Bucket(bucketIntents).ForEach(func(k, v []byte) error {
		if len(k) != 8 || len(v) != 1 {
			return fmt.Errorf("intent record: %w", ErrCorrupt)
		}
		return fn(record{kind: recIntent, pack: beUint64(k), info: packInfo{Flags: v[0]}})
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
		pi, err := decodePackInfo(v)
		if err != nil || len(k) != 8 {
			return fmt.Errorf("pack record: %w", ErrCorrupt)
		}
		return fn(record{kind: recPack, pack: beUint64(k), info: pi})
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketChunks).ForEach(func(k, v []byte) error {
		l, err := decodeLocation(v)
		if err != nil || len(k) != IDSize {
			return fmt.Errorf("chunk record: %w", ErrCorrupt)
		}
		r := record{kind: recChunk, loc: l}
		copy(r.id[:], k)
		return fn(r)
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketObjects).ForEach(func(k, v []byte) error {
		return fn(record{kind: recObject, obj: append([]byte(nil), v...)})
	}); err != nil {
		return err
	}
	return tx.Bucket(bucketHeads).ForEach(func(k, v []byte) error {
		h, err := decodeHead(string(k), v)
		if err != nil {
			return err
		}
		return fn(record{kind: recHead, head: h})
	})
}

// writeSnapshotLog writes generation gen holding the index's content: to a
// temporary name, synced, then renamed into place and the directory synced.
// It returns the new log, open for appending. The caller records the new
// generation in the index; until it does, the older generation stays the
// one the index follows (open replays the newer one from its start, which
// changes nothing it already has).
func writeSnapshotLog(fsys vfs.FS, dir string, gen uint64, db *bolt.DB) (*metaLog, error) {
	l := &metaLog{fs: fsys, dir: dir, gen: gen}
	tmp := l.path() + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write metadata log: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			fsys.Remove(tmp)
		}
	}()
	off := int64(0)
	write := func(b []byte) error {
		n, err := f.WriteAt(b, off)
		if err == nil && n != len(b) {
			err = io.ErrShortWrite
		}
		off += int64(n)
		return err
	}
	if err := write([]byte(logMagic)); err != nil {
		return nil, fmt.Errorf("write metadata log: %w", err)
	}
	var payload []byte
	err = db.View(func(tx *bolt.Tx) error {
		return snapshotRecords(tx, func(r record) error {
			payload = appendRecord(payload, r)
			if len(payload) >= snapshotFrame {
				err := write(frame(payload))
				payload = payload[:0]
				return err
			}
			return nil
		})
	})
	if err == nil && len(payload) > 0 {
		err = write(frame(payload))
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = fsys.Rename(tmp, l.path())
	}
	if err == nil {
		err = fsys.SyncDir(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("write metadata log: %w", err)
	}
	ok = true
	l.f, l.size = f, off
	return l, nil
}
