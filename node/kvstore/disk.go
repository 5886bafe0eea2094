package kvstore

// The disk tier: one file per block, <Dir>/<ns as 8 hex>/<key as 64
// hex>.kvb, the block's bytes from offset 0 (so a later O_DIRECT or cuFile
// read of a 4 KiB-multiple block is aligned) followed by a trailer of
// trailerSize bytes. A file is written under a temporary name and renamed
// into place, without fsync: after a crash a block whose bytes did not all
// reach the disk fails its BLAKE3 and is a miss, never wrong data.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/kylix/kylix/chunkstore"
)

// Block file trailer: {u32 magic "KYKV"; u16 version 1; u16 reserved 0;
// u32 ns; u32 reserved 0; u64 length; u8 key[32]; u8 blake3[32]; zero to
// trailerSize}, little-endian.
const (
	trailerMagic   = 0x564b594b // "KYKV" read as a little-endian u32
	trailerVersion = 1
	trailerSize    = 128
	blockExt       = ".kvb"
	tmpPrefix      = ".tmp-"
)

var le = binary.LittleEndian

// diskSize is what a block file is counted for against the disk budget:
// its length rounded up to the 4 KiB a file system allocates in.
func diskSize(blockSize int) int64 {
	return (int64(blockSize) + trailerSize + 4095) &^ 4095
}

func trailer(k Key, sum chunkstore.ID, n int) []byte {
	t := make([]byte, trailerSize)
	le.PutUint32(t, trailerMagic)
	le.PutUint16(t[4:], trailerVersion)
	le.PutUint32(t[8:], k.NS)
	le.PutUint64(t[16:], uint64(n))
	copy(t[24:56], k.ID[:])
	copy(t[56:88], sum[:])
	return t
}

func (s *Store) path(k Key) string {
	return filepath.Join(s.opt.Dir, fmt.Sprintf("%08x", k.NS), hex.EncodeToString(k.ID[:])+blockExt)
}

// errBadBlock: a block file that is not the block it is named for, or
// whose bytes fail their BLAKE3.
var errBadBlock = errors.New("kv: block file failed its check")

// errDirectRefused: the file system would not read a block file with
// O_DIRECT (tmpfs, some FUSE and network file systems).
var errDirectRefused = errors.New("O_DIRECT refused")

// DiskReadsDirect and DiskReadsBuffered name how the disk tier reads
// blocks (Stats.DiskReads); a buffered tier says why after a colon.
const (
	DiskReadsDirect   = "O_DIRECT"
	DiskReadsBuffered = "buffered"
)

// pageSize is the alignment O_DIRECT asks of offsets, lengths and memory.
const pageSize = 4096

// aligned reports whether b may be read into with O_DIRECT.
func aligned(b []byte) bool {
	return len(b) > 0 && len(b)%pageSize == 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%pageSize == 0
}

// alignedPage returns a page-aligned buffer of one page (for a block
// file's trailer under O_DIRECT).
func alignedPage() []byte {
	b := make([]byte, 2*pageSize)
	off := (pageSize - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%pageSize)) % pageSize
	return b[off : off+pageSize : off+pageSize]
}

// readBlock reads k's block file into data and verifies it, with
// O_DIRECT where the block and data allow it and the file system takes
// it: a block read from the disk tier goes into the host tier, so
// keeping it in the page cache as well would only push out what others
// read (a model's packs). The first refusal turns the tier buffered for
// good, as Stats.DiskReads and the log say.
func (s *Store) readBlock(path string, k Key, data []byte) (chunkstore.ID, error) {
	if s.direct.Load() && aligned(data) {
		sum, err := s.read(path, k, data, true)
		if !errors.Is(err, errDirectRefused) {
			return sum, err
		}
		s.mu.Lock()
		if s.direct.Swap(false) {
			s.diskReads = DiskReadsBuffered + ": " + err.Error()
			s.log.Warn("kv: the disk tier reads through the page cache: its file system refused O_DIRECT", "dir", s.opt.Dir, "err", err)
		}
		s.mu.Unlock()
	}
	return s.read(path, k, data, false)
}

// readBlockFile reads k's block file into data (one block long) and
// verifies it; it returns the block's BLAKE3. With direct, the file is
// opened O_DIRECT (data must be aligned); errDirectRefused when the file
// system will not.
func readBlockFile(path string, k Key, data []byte, direct bool) (chunkstore.ID, error) {
	var sum chunkstore.ID
	flags := os.O_RDONLY
	if direct {
		flags |= syscall.O_DIRECT
	}
	f, err := os.OpenFile(path, flags, 0)
	if direct && errors.Is(err, syscall.EINVAL) {
		return sum, fmt.Errorf("%w: opening %s: %w", errDirectRefused, path, err)
	}
	if err != nil {
		return sum, err
	}
	defer f.Close()
	blockSize := len(data)
	n, err := f.ReadAt(data, 0)
	if direct && n == 0 && errors.Is(err, syscall.EINVAL) {
		return sum, fmt.Errorf("%w: reading %s: %w", errDirectRefused, path, err)
	}
	if err != nil && !(errors.Is(err, io.EOF) && n == len(data)) {
		return sum, fmt.Errorf("%w: %s: %w", errBadBlock, path, err)
	}
	// One byte more than the trailer: a longer file is refused.
	t := make([]byte, trailerSize+1)
	if direct {
		t = alignedPage()
	}
	n, err = f.ReadAt(t, int64(blockSize))
	if n != trailerSize {
		return sum, fmt.Errorf("%w: %s: the trailer: %d bytes (%v), want %d", errBadBlock, path, n, err, trailerSize)
	}
	var id [32]byte
	copy(id[:], t[24:56])
	if le.Uint32(t) != trailerMagic || le.Uint16(t[4:]) != trailerVersion || le.Uint32(t[8:]) != k.NS || le.Uint64(t[16:]) != uint64(blockSize) || id != k.ID {
		return sum, fmt.Errorf("%w: %s: its trailer names another block", errBadBlock, path)
	}
	if sum = chunkstore.Sum(data); !bytes.Equal(sum[:], t[56:88]) {
		return sum, fmt.Errorf("%w: %s: BLAKE3 mismatch", errBadBlock, path)
	}
	return sum, nil
}

// writeBlockFile writes data and trailer tr to path, through a temporary
// file renamed into place.
func writeBlockFile(path string, data, tr []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tmpPrefix)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		_, err = f.Write(tr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func removeFiles(paths []string) {
	for _, p := range paths {
		os.Remove(p)
	}
}

// dropDisk takes e off the disk tier (and out of the store when it is in
// no memory either); unlink removes its file now. s.mu held.
func (s *Store) dropDisk(e *entry, unlink bool) {
	if e.disk == nil {
		return
	}
	s.diskLRU.Remove(e.disk)
	s.diskNS.add(e.key.NS, -1)
	e.disk = nil
	s.diskUsed -= s.diskSize
	if e.mem == nil {
		delete(s.m, e.key)
	}
	if unlink {
		os.Remove(s.path(e.key))
	}
}

// rebuild makes the disk index from Dir: every file named as a block, of
// the size a block file of this block size has, in mtime order (the
// oldest least recently used). Temporary files of a write a crash cut
// short, and block files of another size, are removed. Blocks are not
// read here: each is verified when it is read.
func (s *Store) rebuild() error {
	if err := os.MkdirAll(s.opt.Dir, 0o700); err != nil {
		return fmt.Errorf("kv: disk tier directory: %w", err)
	}
	if err := os.Chmod(s.opt.Dir, 0o700); err != nil {
		return fmt.Errorf("kv: disk tier directory: %w", err)
	}
	type found struct {
		k     Key
		mtime time.Time
	}
	var fs []found
	var removed int
	nss, err := os.ReadDir(s.opt.Dir)
	if err != nil {
		return fmt.Errorf("kv: disk tier directory: %w", err)
	}
	for _, d := range nss {
		ns, err := strconv.ParseUint(d.Name(), 16, 32)
		if !d.IsDir() || err != nil || len(d.Name()) != 8 {
			continue
		}
		sub := filepath.Join(s.opt.Dir, d.Name())
		ents, err := os.ReadDir(sub)
		if err != nil {
			return fmt.Errorf("kv: disk tier directory: %w", err)
		}
		for _, f := range ents {
			name := f.Name()
			p := filepath.Join(sub, name)
			if strings.HasPrefix(name, tmpPrefix) {
				os.Remove(p)
				removed++
				continue
			}
			id, err := hex.DecodeString(strings.TrimSuffix(name, blockExt))
			if !strings.HasSuffix(name, blockExt) || err != nil || len(id) != 32 || !f.Type().IsRegular() {
				continue
			}
			fi, err := f.Info()
			if err != nil {
				continue
			}
			if fi.Size() != int64(s.opt.BlockSize)+trailerSize {
				os.Remove(p)
				removed++
				continue
			}
			k := Key{NS: uint32(ns)}
			copy(k.ID[:], id)
			fs = append(fs, found{k, fi.ModTime()})
		}
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].mtime.Before(fs[j].mtime) })
	var unlink []string
	for _, f := range fs {
		e := &entry{key: f.k}
		s.m[f.k] = e
		e.disk = s.diskLRU.PushFront(e)
		s.diskNS.add(f.k.NS, 1)
		s.diskUsed += s.diskSize
	}
	for s.diskUsed > s.opt.DiskBudget { // a smaller budget than last time
		e := s.diskLRU.Back().Value.(*entry)
		unlink = append(unlink, s.path(e.key))
		s.dropDisk(e, false)
		s.st.diskEvictions++
	}
	removeFiles(unlink)
	s.log.Info("kv: disk tier", "dir", s.opt.Dir, "blocks", s.diskLRU.Len(), "bytes", s.diskUsed, "removed", removed+len(unlink))
	return nil
}

// writer writes queued blocks to disk, one at a time, until Close.
func (s *Store) writer() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 {
			s.writing = false
			s.idle.Broadcast()
			if s.closed {
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			<-s.wake
			s.mu.Lock()
		}
		q := s.queue[0]
		s.queue[0] = queued{}
		s.queue = s.queue[1:]
		s.writing = true
		s.writeOne(q) // unlocks and relocks
		s.mu.Unlock()
	}
}

// writeOne writes q's block if it is still the one to write: room is
// made by evicting the disk tier's least recently used blocks; when none
// can be made, or the write fails, the block stays in memory only and the
// reason is kept for Stats. s.mu held; released during the write.
func (s *Store) writeOne(q queued) {
	e := q.e
	if s.m[e.key] != e || e.gen != q.gen || !e.dirty || e.data == nil {
		return
	}
	var unlink []string
	if e.disk == nil {
		// Room by the fair-share rule (share.go).
		for _, may := range s.diskNS.victims(int(s.opt.DiskBudget/s.diskSize), e.key.NS) {
			for el := s.diskLRU.Back(); el != nil && s.diskUsed+s.diskSize > s.opt.DiskBudget; {
				v := el.Value.(*entry)
				el = el.Prev()
				if !may(v.key) {
					continue
				}
				unlink = append(unlink, s.path(v.key))
				s.dropDisk(v, false)
				s.st.diskEvictions++
			}
		}
		if s.diskUsed+s.diskSize > s.opt.DiskBudget {
			s.memOnlyLocked(e, fmt.Errorf("the disk budget (%d bytes) is smaller than one block file (%d)", s.opt.DiskBudget, s.diskSize))
			return
		}
		e.disk = s.diskLRU.PushFront(e)
		s.diskNS.add(e.key.NS, 1)
		s.diskUsed += s.diskSize
	} else {
		s.diskLRU.MoveToFront(e.disk)
	}
	data, tr, path := e.data, trailer(e.key, e.sum, len(e.data)), s.path(e.key)
	slot := e.slot
	s.arena.hold(slot) // the slot stays e's bytes while they are written
	s.lent++
	s.mu.Unlock()
	removeFiles(unlink)
	err := s.write(path, data, tr)
	s.mu.Lock()
	s.arena.unhold(slot)
	s.unlend()
	switch {
	case s.m[e.key] != e || e.disk == nil:
		// Cleared (or dropped) while it was written: the file must go.
		if err == nil {
			os.Remove(path)
		}
	case err != nil:
		s.dropDisk(e, false)
		os.Remove(path) // an older version of the block may be there
		s.st.diskWriteErrors++
		s.memOnlyLocked(e, err)
	default:
		s.st.diskWrites++
		if e.gen == q.gen && e.dirty {
			e.dirty = false
			s.dirty--
		}
	}
}

// memOnlyLocked marks e as kept in memory only (its disk write could not
// be done), with the reason. s.mu held.
func (s *Store) memOnlyLocked(e *entry, err error) {
	if e.dirty {
		e.dirty = false
		s.dirty--
	}
	s.st.memOnly++
	s.st.lastDiskError = err.Error()
	s.st.lastDiskErrorAt = time.Now()
	if errors.Is(err, syscall.ENOSPC) {
		s.st.lastDiskError += " (the disk tier's file system is full: lower --kv-disk or free space)"
	}
	s.log.Warn("kv: block kept in memory only", "err", err)
}
