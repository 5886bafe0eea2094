package fs

// The rule for shared packs handed to clients (docs/design/preload.md): a
// pack that holds bytes of several files is given to a process only if
// that process may read every one of those files, as the kernel would
// decide with default_permissions (mode, owner, group and supplementary
// groups, and search permission on every directory above the file). The
// caller's identity comes from SO_PEERCRED and /proc/PID/status.

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// Cred is a client's identity for the shared-pack rule.
type Cred struct {
	UID, GID uint32
	Groups   []uint32 // supplementary groups
}

// CredOfPeer returns the identity of a connected peer: uid and gid from
// SO_PEERCRED, supplementary groups from /proc/PID/status. The status
// file must agree with the uid the socket reported (a pid reused since
// the connect reads another process's groups: refused).
func CredOfPeer(pid int32, uid, gid uint32) (Cred, error) {
	c := Cred{UID: uid, GID: gid}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return c, fmt.Errorf("read the groups of client process %d: %w", pid, err)
	}
	defer f.Close()
	sawUID := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		switch k {
		case "Uid":
			// real, effective, saved, fs: the fs uid is what the kernel checks.
			if len(fields) != 4 || fields[3] != strconv.FormatUint(uint64(uid), 10) {
				return c, fmt.Errorf("client process %d is no longer uid %d (it exited and its pid was reused?)", pid, uid)
			}
			sawUID = true
		case "Groups":
			for _, g := range fields {
				n, err := strconv.ParseUint(g, 10, 32)
				if err != nil {
					return c, fmt.Errorf("groups of client process %d: bad group %q in /proc status", pid, g)
				}
				c.Groups = append(c.Groups, uint32(n))
			}
		}
	}
	if err := sc.Err(); err != nil || !sawUID {
		return c, fmt.Errorf("groups of client process %d: its /proc status has no Uid line", pid)
	}
	return c, nil
}

// perm is one entry's owner and permission bits.
type perm struct {
	uid, gid uint32
	mode     uint32
}

// allows reports whether c has any of the bits want (4 read, 1 search)
// on p, in the kernel's order: owner, then group, then others; uid 0 may
// read and search everything.
func (p perm) allows(c Cred, want uint32) bool {
	if c.UID == 0 {
		return true
	}
	switch {
	case c.UID == p.uid:
		return (p.mode>>6)&want == want
	case c.GID == p.gid || slices.Contains(c.Groups, p.gid):
		return (p.mode>>3)&want == want
	}
	return p.mode&want == want
}

// packReaders caches, per namespace root (any change makes a new root),
// the files with bytes in each pack, as their access chains: the
// directories above each file, then the file.
type packReaders struct {
	mu     sync.Mutex
	root   chunkstore.ID
	chains map[uint64][][]perm
	// spans: per pack, the byte ranges live files of the namespace have
	// there (their extents), sorted and merged.
	spans map[uint64][]span
	// covered: packs whose bytes below a size were found to be all named
	// by live files, padding, holes or zeros (PackHandableTo), this root.
	covered map[packSize]bool
}

type span struct{ off, end int64 }

type packSize struct {
	pack uint64
	size int64
}

// PackTable is the file's pack table (the order of KYLIX_IOC_CHUNKS'
// pack_index and of KYLIX_IOC_PACK).
func PackTable(sf *chunkstore.File) []uint64 { return packTable(sf) }

// PackReadableBy reports whether c may read every file of the namespace
// that has bytes in pack. The first call after a namespace change walks
// the namespace and each file's chunk locations (cost: one index lookup
// per chunk of every file); later calls are map lookups.
func (f *FS) PackReadableBy(pack uint64, c Cred) (bool, error) {
	r, err := f.packReadersNow()
	if err != nil {
		return false, err
	}
	defer r.mu.Unlock()
	return r.readable(pack, c), nil
}

// packReadersNow returns the cache, brought level with the namespace, locked.
func (f *FS) packReadersNow() (*packReaders, error) {
	// A chmod or chown through the mount reaches the store through the
	// committer: wait for what is queued, so the walk sees it.
	if err := f.com.wait(f.com.barrier()); err != nil {
		return nil, fmt.Errorf("commit pending changes before deciding who may read a pack: %w", err)
	}
	r := &f.readers
	r.mu.Lock()
	root, _, err := f.s.Root()
	if err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("read the namespace root: %w", err)
	}
	if r.chains == nil || r.root != root {
		chains, spans, err := f.packChains()
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		r.root, r.chains, r.spans, r.covered = root, chains, spans, map[packSize]bool{}
	}
	return r, nil
}

func (r *packReaders) readable(pack uint64, c Cred) bool {
	for _, chain := range r.chains[pack] {
		for i, p := range chain {
			want := uint32(1) // search a directory
			if i == len(chain)-1 {
				want = 4 // read the file
			}
			if !p.allows(c, want) {
				return false
			}
		}
	}
	return true
}

// PackHandableTo decides whether pf, a read-only descriptor of pack opened
// after the pack was sealed (chunkstore.Store.SealForHandout: it never
// grows again), may be given to a client with identity c. Nil means yes:
//   - c may read every file of the namespace with bytes in the pack
//     (PackReadableBy), and
//   - every byte of the descriptor, from 0 to its size, lies in an extent
//     of a live file of the namespace, or in alignment padding (less than
//     4 KiB up to a 4 KiB boundary, where import starts each region), or
//     in a hole, or is zero. Anything else is someone's bytes that no live
//     file names here: a deleted file's (until GC), an import not yet
//     committed or aborted, a chunk kept for a cluster member, a file of
//     another namespace; the pack is then not handed out.
//
// The coverage result is kept per (pack, size) until the namespace changes.
func (f *FS) PackHandableTo(pack uint64, pf *os.File, c Cred) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(pf.Fd()), &st); err != nil {
		return err
	}
	r, err := f.packReadersNow()
	if err != nil {
		return err
	}
	defer r.mu.Unlock()
	if !r.readable(pack, c) {
		return fmt.Errorf("it holds bytes of a file uid %d may not read", c.UID)
	}
	k := packSize{pack, st.Size}
	if r.covered[k] {
		return nil
	}
	// uncovered seeks (SEEK_DATA) on pf; the client shares its offset.
	defer unix.Seek(int(pf.Fd()), 0, unix.SEEK_SET)
	if err := uncovered(pf, r.spans[pack], st.Size); err != nil {
		return err
	}
	r.covered[k] = true
	return nil
}

// packAlign is the alignment import and compaction start regions at.
const packAlign = 4096

// uncovered returns nil if every byte of pf below size is in spans
// (sorted, merged), alignment padding, a hole or zero; else an error
// naming the first range that is not.
func uncovered(pf *os.File, spans []span, size int64) error {
	var pos int64
	var buf []byte
	gap := func(a, b int64) error {
		if a >= b || (b-a < packAlign && b%packAlign == 0) {
			return nil
		}
		for a < b {
			// Skip holes: no bytes there.
			d, err := unix.Seek(int(pf.Fd()), a, unix.SEEK_DATA)
			if err != nil || d >= b {
				if err != nil && err != unix.ENXIO {
					return fmt.Errorf("find data in pack at %d: %w", a, err)
				}
				return nil
			}
			a = d
			n := min(b-a, 1<<20)
			if int64(len(buf)) < n {
				buf = make([]byte, n)
			}
			m, err := pf.ReadAt(buf[:n], a)
			if err != nil && m < int(n) {
				return fmt.Errorf("read pack at %d: %w", a, err)
			}
			for i, x := range buf[:n] {
				if x != 0 {
					return fmt.Errorf("bytes at %d..%d of the pack belong to no live file of the namespace (a deleted file's, an uncommitted import's, or another namespace's)", a+int64(i), b)
				}
			}
			a += n
		}
		return nil
	}
	for _, sp := range spans {
		if sp.off >= size {
			break
		}
		if err := gap(pos, sp.off); err != nil {
			return err
		}
		pos = max(pos, sp.end)
	}
	return gap(pos, size)
}

// packChains walks the namespace: for each file, its access chain, filed
// under every pack that holds some of its bytes.
// It also returns, per pack, the ranges live files have there (sorted,
// merged).
func (f *FS) packChains() (map[uint64][][]perm, map[uint64][]span, error) {
	dirs := map[string][]perm{"": nil} // path -> chain of the directories down to it, inclusive
	packsOf := map[chunkstore.ID][]uint64{}
	out := map[uint64][][]perm{}
	spans := map[uint64][]span{}
	permOf := func(e chunkstore.Entry) perm {
		uid, gid := f.owner(e.UID, e.GID)
		return perm{uid: uid, gid: gid, mode: uint32(e.Mode.Perm())}
	}
	err := f.s.Walk("", func(p string, e chunkstore.Entry) error {
		if p == "" {
			return nil // the mount's root: its own mode is the mount point's
		}
		parent := ""
		if i := strings.LastIndexByte(p, '/'); i >= 0 {
			parent = p[:i]
		}
		up := dirs[parent]
		switch e.Kind {
		case chunkstore.KindDir:
			dirs[p] = append(slices.Clip(up), permOf(e))
			return nil
		case chunkstore.KindFile:
		default:
			return nil
		}
		packs, seen := packsOf[e.ID]
		if !seen {
			sf, err := f.s.OpenFile(e.ID)
			if err != nil {
				return fmt.Errorf("open %s to list its packs: %w", p, err)
			}
			packs = packTable(sf)
			packsOf[e.ID] = packs
			for _, x := range sf.Extents() {
				if x.Pack != 0 {
					spans[x.Pack] = append(spans[x.Pack], span{x.PackOff, x.PackOff + x.Len})
				}
			}
		}
		chain := append(slices.Clip(up), permOf(e))
		for _, pk := range packs {
			out[pk] = append(out[pk], chain)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("find who may read each pack: %w", err)
	}
	for p, ss := range spans {
		slices.SortFunc(ss, func(a, b span) int { return cmp.Compare(a.off, b.off) })
		m := ss[:0]
		for _, x := range ss {
			if k := len(m) - 1; k >= 0 && x.off <= m[k].end {
				m[k].end = max(m[k].end, x.end)
				continue
			}
			m = append(m, x)
		}
		spans[p] = m
	}
	return out, spans, nil
}
