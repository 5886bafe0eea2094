package fs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/units"
)

// Space accounting (docs/design/space.md). A file written through the
// mount takes space twice before it is committed: its working copy in
// DATA/tmp, then the packs its commit writes (the working copy is freed
// only after that). The node therefore admits a write only if the working
// copy's growth plus what its commit will need still fit in the free space,
// after what earlier working copies' commits are owed (pending) and after
// the reserve for callers whose uid is not 0.

// DefaultReservePercent is the reserve when Options.Reserve is nil: the
// share of the data directory's file system that ext4 keeps for root.
const DefaultReservePercent = 5

// DefaultLowSpace is Options.LowSpace's default.
const DefaultLowSpace = 64 << 20

// commitHeadroom is kept free for every writer, root included: the index
// transactions of a commit batch (file and directory manifests, bbolt's
// copy-on-write pages) need room that cannot be foreseen per file.
const commitHeadroom = 1 << 20

// commitNeed is what committing a working copy with alloc allocated bytes
// may write: the bytes themselves, a 4 KiB alignment gap in a shared pack
// and the manifest (40 bytes per chunk; chunks are far larger than 5 KiB).
func commitNeed(alloc int64) int64 {
	if alloc <= 0 {
		return 0
	}
	return alloc + 4096 + alloc/128
}

// Reserve is free space on the data directory's file system that writers
// through the mount whose uid is not 0 cannot use.
type Reserve struct {
	// Bytes is the reserve when Percent is 0.
	Bytes int64
	// Percent is the reserve as a share of the file system's size.
	Percent float64
}

// ParseReserve reads "5%", "0", "512MiB", "2G" or a plain byte count
// (units.ParseSizeOrPercent).
func ParseReserve(s string) (Reserve, error) {
	v, err := units.ParseSizeOrPercent(s)
	if err != nil {
		return Reserve{}, fmt.Errorf("reserve %w", err)
	}
	return Reserve(v), nil
}

func (r Reserve) String() string { return units.SizeOrPercent(r).String() }

// bytesOf returns the reserve for a file system of total bytes.
func (r Reserve) bytesOf(total int64) int64 { return units.SizeOrPercent(r).Of(total) }

// space keeps the node's account of the data directory's free space.
type space struct {
	dir     string
	reserve Reserve
	low     int64
	// root: the node may use the file system's own root reserve (ext4's
	// f_bfree); otherwise only f_bavail is the node's.
	root bool
	// makeRoom is Options.MakeRoom (nil: none).
	makeRoom func(need int64) int64

	mu sync.Mutex
	// pending is what the commits of live working copies may still write
	// (the sum of their tempFile.res).
	pending int64
	// inflight is working-copy growth admitted and not yet written.
	inflight int64
}

// spaceState is one look at the file system.
type spaceState struct {
	frsize  int64
	total   int64
	free    int64 // bytes the node itself may still allocate
	reserve int64
	raw     unix.Statfs_t
}

func (s *space) stat() (spaceState, error) {
	var st spaceState
	if err := unix.Statfs(s.dir, &st.raw); err != nil {
		return st, fmt.Errorf("statfs %s: %w", s.dir, err)
	}
	st.frsize = st.raw.Frsize
	if st.frsize <= 0 {
		st.frsize = st.raw.Bsize
	}
	st.total = int64(st.raw.Blocks) * st.frsize
	if s.root {
		st.free = int64(st.raw.Bfree) * st.frsize
	} else {
		st.free = int64(st.raw.Bavail) * st.frsize
	}
	st.reserve = s.reserve.bytesOf(st.total)
	return st, nil
}

// usableLocked returns what root (and what any other caller) may still
// write through the mount.
func (s *space) usableLocked(st spaceState) (root, user int64) {
	root = st.free - s.pending - s.inflight - commitHeadroom
	user = root - st.reserve
	return max(root, 0), max(user, 0)
}

// errNoSpace is the refusal of a write the node cannot commit.
// makeRoomTries bounds the times a write asks makeRoom for room.
const makeRoomTries = 8

var errNoSpace = fmt.Errorf("not enough free space to commit the write (reserve and pending commits included): %w", syscall.ENOSPC)

// admit makes room for t's working copy to grow by up to grow bytes now,
// and for its commit to grow with it. The caller calls done(t, grow)
// after the write. When they do not fit, makeRoom (a cluster member's
// peer cache: copies of chunks other members keep) is asked to free the
// difference first: a write through the mount comes before those
// copies, which are fetched again when needed.
func (s *space) admit(t *tempFile, grow int64, privileged bool) error {
	if grow <= 0 {
		return nil
	}
	for try := 0; ; try++ {
		st, err := s.stat()
		if err != nil {
			return err
		}
		s.mu.Lock()
		res := max(commitNeed(t.alloc+grow)-t.res, 0)
		// Unclamped: below the reserve, what is short counts from there.
		avail := st.free - s.pending - s.inflight - commitHeadroom
		if !privileged {
			avail -= st.reserve
		}
		if grow+res <= avail {
			t.res += res
			s.pending += res
			s.inflight += grow
			s.mu.Unlock()
			return nil
		}
		short := grow + res - avail
		s.mu.Unlock()
		// Again while makeRoom frees something (others may take what it
		// freed meanwhile), a bounded number of times.
		if try >= makeRoomTries || s.makeRoom == nil || s.makeRoom(short) <= 0 {
			return errNoSpace
		}
	}
}

// done ends a write admitted with admit and sets t's reservation from the
// space its working copy really holds now.
func (s *space) done(t *tempFile, grow int64) {
	alloc := t.allocated()
	s.mu.Lock()
	defer s.mu.Unlock()
	if grow > 0 {
		s.inflight -= grow
	}
	if alloc >= 0 {
		need := commitNeed(alloc)
		s.pending += need - t.res
		t.res, t.alloc = need, alloc
	}
}

// free drops t's reservation (its working copy is gone).
func (s *space) free(t *tempFile) {
	s.mu.Lock()
	s.pending -= t.res
	t.res = 0
	s.mu.Unlock()
}

// fits reports whether grow more bytes of working copy, and their
// commit, fit now.
func (s *space) fits(grow int64, privileged bool) bool {
	st, err := s.stat()
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	root, user := s.usableLocked(st)
	avail := user
	if privileged {
		avail = root
	}
	return grow+commitNeed(grow) <= avail
}

// waitForRoom waits for the commits in flight when a write of grow bytes
// would not fit: they free their working copies' space, so a writer that
// runs ahead of the committer waits instead of getting a false ENOSPC.
// Callers hold no locks of ours.
func (f *FS) waitForRoom(grow int64, privileged bool) {
	if grow <= 0 || f.space.fits(grow, privileged) || !f.com.busy() {
		return
	}
	f.com.wait(f.com.barrier())
}

// SpaceClaimed is what writes through the mount have set aside on the
// data directory's file system and not written yet: the commits of live
// working copies, growth admitted and not written, and the headroom of a
// commit batch. Others writing there (the peer cache) leave it free.
func (f *FS) SpaceClaimed() int64 {
	s := f.space
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending + s.inflight + commitHeadroom
}

// lowNow reports whether the free space above the reserve is below the
// low-water mark: then the last close of a file waits for its commit.
func (s *space) lowNow() bool {
	if s.low < 0 {
		return false
	}
	st, err := s.stat()
	if err != nil {
		return true
	}
	s.mu.Lock()
	_, user := s.usableLocked(st)
	s.mu.Unlock()
	return user < s.low
}

// statfs answers statfs(2) through the mount: the data directory's file
// system, less what pending commits will write; f_bavail also less the
// reserve.
func (f *FS) statfs(out *fuse.StatfsOut) syscall.Errno {
	st, err := f.space.stat()
	if err != nil {
		return toErrno(err)
	}
	raw := syscall.Statfs_t{
		Blocks: st.raw.Blocks, Bfree: st.raw.Bfree, Bavail: st.raw.Bavail,
		Files: st.raw.Files, Ffree: st.raw.Ffree, Bsize: st.raw.Bsize,
		Frsize: st.raw.Frsize, Namelen: st.raw.Namelen,
	}
	out.FromStatfsT(&raw)
	f.space.mu.Lock()
	root, user := f.space.usableLocked(st)
	f.space.mu.Unlock()
	out.Bfree = uint64(root / st.frsize)
	out.Bavail = uint64(user / st.frsize)
	out.NameLen = chunkstore.MaxNameLen
	return 0
}

// privileged reports whether a request may write into the reserve: its
// caller has uid 0. Requests the kernel sends on its own (writeback of
// shared mappings) carry no caller (pid 0) and are held to the reserve.
func privileged(ctx context.Context) bool {
	c, ok := fuse.FromContext(ctx)
	return ok && c.Uid == 0 && c.Pid != 0
}

// failErrno is what close, fsync and later writes answer for a version that
// could not be committed: ENOSPC when space was the reason, else EIO.
func failErrno(err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return syscall.ENOSPC
	}
	return syscall.EIO
}
