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

// packReaders is, for one namespace root, every live file with bytes in
// some pack, with its access chain (the directories above it, then the
// file) and its extents per pack. It is kept level with the namespace by
// diffing the old root's tree against the new one (the namespace is a
// Merkle tree: a directory whose manifest did not change is skipped
// whole), so a commit that adds files costs the directories it changed,
// not a walk of the namespace; see packReadersNow for why it is exact.
type packReaders struct {
	mu    sync.Mutex
	built bool // false: the next use builds from nothing
	root  chunkstore.ID
	files map[string]*permFile
	// byPack: per pack, the live files with bytes there.
	byPack map[uint64]map[string]struct{}
	// spans: per pack, the byte ranges live files of the namespace have
	// there (their extents), sorted and merged; recomputed from byPack
	// for packs in stale.
	spans map[uint64][]span
	stale map[uint64]bool
	// covered: per pack, the sizes below which the pack's bytes were
	// found to be all named by live files, padding, holes or zeros
	// (PackHandableTo). Dropped for a pack whose files change.
	covered map[uint64]map[int64]bool
	// rebuiltFor: per pack that made the map build from nothing (it
	// knew no file there, or the pack's bytes were not covered), the
	// root it was built for: once per pack and root.
	rebuiltFor map[uint64]chunkstore.ID
	// Counters for tests and docs: full builds and incremental updates.
	builds, diffs int
}

// permFile is one live file of the namespace as the pack rule sees it.
type permFile struct {
	chain []perm
	ext   map[uint64][]span // per pack, the file's extents there
}

type span struct{ off, end int64 }

// PackTable is the file's pack table (the order of KYLIX_IOC_CHUNKS'
// pack_index and of KYLIX_IOC_PACK).
func PackTable(sf *chunkstore.File) []uint64 { return packTable(sf) }

// PackReadableBy reports whether c may read every file of the namespace
// that has bytes in pack. The first call after a namespace change walks
// the namespace and each file's chunk locations (cost: one index lookup
// per chunk of every file); later calls are map lookups.
func (f *FS) PackReadableBy(pack uint64, c Cred) (bool, error) {
	r, err := f.packReadersNow(pack)
	if err != nil {
		return false, err
	}
	defer r.mu.Unlock()
	return r.readable(pack, c), nil
}

// packReadersNow returns the cache, brought level with the namespace, locked.
//
// Why the answer is exact (docs/design/client.md: the caller may read
// every live file with bytes in the pack, as of the request):
//
//   - Changes through the mount that change who may read bytes the
//     namespace already names are either synchronous store updates (rename,
//     unlink, rmdir, a directory's chmod or chown: done when the syscall
//     returns) or queued to the committer: a file's chmod or chown, and
//     any new version of a file that has a store entry. Those are what the
//     committer's perm ticket counts; we wait for it, so every such change
//     that returned before this request is in the root read below. What
//     is not waited for is the first commit of a file created through the
//     mount: until it is written the namespace has no entry for that file
//     (a rename over an existing name removes the replaced entry at once,
//     dir.go), so it names no bytes and takes no reader's right away; the
//     request is served as of a root before it. A pack the map does not
//     know has no live file in the map, so its bytes are uncovered (an
//     unknown pack is refused by PackHandableTo, never answered from a
//     stale map), and bytes a later commit appends to a known pack are
//     beyond the spans the map has: uncovered too.
//   - Store updates behind the mount's back (import, rm, a peer's merge)
//     change the root at once.
//   - The map is brought to the current root by a diff that handles
//     removal, changed entries and changed directory permissions exactly
//     (remove the old entry's files, add the new entry's), so it always
//     equals what a full walk of that root gives.
//
// A pack the map has no file in (its chunks moved there by compaction,
// with the namespace unchanged, or a pack of no live file) makes the map
// build from nothing, once per pack and root.
func (f *FS) packReadersNow(pack uint64) (*packReaders, error) {
	if err := f.com.wait(f.com.permBarrier()); err != nil {
		return nil, fmt.Errorf("commit pending permission changes before deciding who may read a pack: %w", err)
	}
	r := &f.readers
	r.mu.Lock()
	root, _, err := f.s.Root()
	if err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("read the namespace root: %w", err)
	}
	switch {
	case !r.built:
		err = f.rebuildReaders(r, root, 0)
	case r.root != root:
		u := &permUpdate{f: f, r: r, infos: map[chunkstore.ID]*fileInfo{}}
		r.diffs++
		if err = u.diffDir("", nil, r.root, root); err != nil {
			// Half updated (or the old root's manifests are gone,
			// collected): build from nothing.
			err = f.rebuildReaders(r, root, 0)
		} else {
			r.root = root
		}
	}
	if err == nil && pack != 0 && r.byPack[pack] == nil && r.rebuiltFor[pack] != root {
		err = f.rebuildReaders(r, root, pack)
	}
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	return r, nil
}

// rebuildReaders builds r from nothing for root (r.mu held); pack, if
// not 0, is the pack that asked for it.
func (f *FS) rebuildReaders(r *packReaders, root chunkstore.ID, pack uint64) error {
	if r.rebuiltFor == nil {
		r.rebuiltFor = map[uint64]chunkstore.ID{}
	}
	if pack != 0 {
		r.rebuiltFor[pack] = root
	}
	u := &permUpdate{f: f, r: r, infos: map[chunkstore.ID]*fileInfo{}}
	r.files, r.byPack = map[string]*permFile{}, map[uint64]map[string]struct{}{}
	r.spans, r.stale, r.covered = map[uint64][]span{}, map[uint64]bool{}, map[uint64]map[int64]bool{}
	r.builds++
	if err := u.addDir("", nil, root); err != nil {
		r.built = false
		return fmt.Errorf("find who may read each pack: %w", err)
	}
	r.built, r.root = true, root
	return nil
}

func (r *packReaders) readable(pack uint64, c Cred) bool {
	for path := range r.byPack[pack] {
		chain := r.files[path].chain
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
// The coverage result is kept per (pack, size) until the files with bytes
// in the pack change.
func (f *FS) PackHandableTo(pack uint64, pf *os.File, c Cred) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(pf.Fd()), &st); err != nil {
		return err
	}
	r, err := f.packReadersNow(pack)
	if err != nil {
		return err
	}
	defer r.mu.Unlock()
	for {
		if !r.readable(pack, c) {
			return fmt.Errorf("it holds bytes of a file uid %d may not read", c.UID)
		}
		if r.covered[pack][st.Size] {
			return nil
		}
		// uncovered seeks (SEEK_DATA) on pf; the client shares its offset.
		defer unix.Seek(int(pf.Fd()), 0, unix.SEEK_SET)
		err := uncovered(pf, r.spansOf(pack), st.Size)
		if err == nil {
			break
		}
		// Chunks can move between packs with the namespace unchanged
		// (compaction): the extents the map has may be stale. Build
		// the map from nothing once per pack and root before refusing.
		if r.rebuiltFor[pack] == r.root {
			return err
		}
		if err := f.rebuildReaders(r, r.root, pack); err != nil {
			return err
		}
	}
	if r.covered[pack] == nil {
		r.covered[pack] = map[int64]bool{}
	}
	r.covered[pack][st.Size] = true
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

// spansOf returns the pack's merged spans, recomputing them if its files
// changed.
func (r *packReaders) spansOf(pack uint64) []span {
	if !r.stale[pack] {
		return r.spans[pack]
	}
	var ss []span
	for path := range r.byPack[pack] {
		ss = append(ss, r.files[path].ext[pack]...)
	}
	slices.SortFunc(ss, func(a, b span) int { return cmp.Compare(a.off, b.off) })
	m := ss[:0]
	for _, x := range ss {
		if k := len(m) - 1; k >= 0 && x.off <= m[k].end {
			m[k].end = max(m[k].end, x.end)
			continue
		}
		m = append(m, x)
	}
	if len(m) == 0 {
		delete(r.spans, pack)
	} else {
		r.spans[pack] = m
	}
	delete(r.stale, pack)
	return m
}

// fileInfo is a file version's extents per pack.
type fileInfo struct {
	ext map[uint64][]span
}

// permUpdate brings a packReaders from one root to another.
type permUpdate struct {
	f     *FS
	r     *packReaders
	infos map[chunkstore.ID]*fileInfo // file versions opened in this update
}

func (u *permUpdate) permOf(e chunkstore.Entry) perm {
	uid, gid := u.f.owner(e.UID, e.GID)
	return perm{uid: uid, gid: gid, mode: uint32(e.Mode.Perm())}
}

func (u *permUpdate) dir(id chunkstore.ID) ([]chunkstore.Entry, error) {
	m, err := u.f.cache.get(id)
	if err != nil {
		return nil, err
	}
	return m.Live(), nil
}

// addDir adds every file below the directory id at p, whose chain (the
// directories from the mount's root down to it, inclusive; the mount's
// root itself excluded: its mode is the mount point's) is up.
func (u *permUpdate) addDir(p string, up []perm, id chunkstore.ID) error {
	es, err := u.dir(id)
	if err != nil {
		return fmt.Errorf("list %q: %w", p, err)
	}
	for _, e := range es {
		if err := u.add(childPath(p, e.Name), up, e); err != nil {
			return err
		}
	}
	return nil
}

// add adds the entry e at p (a file, or a directory and all below it).
func (u *permUpdate) add(p string, up []perm, e chunkstore.Entry) error {
	switch e.Kind {
	case chunkstore.KindDir:
		return u.addDir(p, append(slices.Clip(up), u.permOf(e)), e.ID)
	case chunkstore.KindFile:
	default:
		return nil
	}
	info := u.infos[e.ID]
	if info == nil {
		sf, err := u.f.s.OpenFile(e.ID)
		if err != nil {
			return fmt.Errorf("open %s to list its packs: %w", p, err)
		}
		u.f.s.NoteRead(e.ID) // handed out to be read (chunkstore/lastread.go)
		info = &fileInfo{ext: map[uint64][]span{}}
		for _, x := range sf.Extents() {
			if x.Pack != 0 {
				info.ext[x.Pack] = append(info.ext[x.Pack], span{x.PackOff, x.PackOff + x.Len})
			}
		}
		u.infos[e.ID] = info
	}
	r := u.r
	u.removeFile(p)
	r.files[p] = &permFile{chain: append(slices.Clip(up), u.permOf(e)), ext: info.ext}
	for pk := range info.ext {
		if r.byPack[pk] == nil {
			r.byPack[pk] = map[string]struct{}{}
		}
		r.byPack[pk][p] = struct{}{}
		u.touch(pk)
	}
	return nil
}

// touch marks a pack whose files changed.
func (u *permUpdate) touch(pk uint64) {
	u.r.stale[pk] = true
	delete(u.r.covered, pk)
}

func (u *permUpdate) removeFile(p string) {
	r := u.r
	pf := r.files[p]
	if pf == nil {
		return
	}
	for pk := range pf.ext {
		delete(r.byPack[pk], p)
		if len(r.byPack[pk]) == 0 {
			delete(r.byPack, pk)
		}
		u.touch(pk)
	}
	delete(r.files, p)
}

// remove removes the entry e at p of the old tree (a file, or a directory
// and all below it).
func (u *permUpdate) remove(p string, e chunkstore.Entry) error {
	switch e.Kind {
	case chunkstore.KindFile:
		u.removeFile(p)
	case chunkstore.KindDir:
		es, err := u.dir(e.ID)
		if err != nil {
			return fmt.Errorf("list %q: %w", p, err)
		}
		for _, c := range es {
			if err := u.remove(childPath(p, c.Name), c); err != nil {
				return err
			}
		}
	}
	return nil
}

// diffDir brings the files below p (chain up) from the directory manifest
// from to the manifest to.
func (u *permUpdate) diffDir(p string, up []perm, from, to chunkstore.ID) error {
	if from == to {
		return nil
	}
	olds, err := u.dir(from)
	if err != nil {
		return fmt.Errorf("list %q: %w", p, err)
	}
	news, err := u.dir(to)
	if err != nil {
		return fmt.Errorf("list %q: %w", p, err)
	}
	i, j := 0, 0
	for i < len(olds) || j < len(news) {
		var c int
		switch {
		case i == len(olds):
			c = 1
		case j == len(news):
			c = -1
		default:
			c = strings.Compare(olds[i].Name, news[j].Name)
		}
		switch {
		case c < 0:
			err = u.remove(childPath(p, olds[i].Name), olds[i])
			i++
		case c > 0:
			err = u.add(childPath(p, news[j].Name), up, news[j])
			j++
		default:
			o, n := olds[i], news[j]
			i, j = i+1, j+1
			cp := childPath(p, n.Name)
			samePerm := o.Kind == n.Kind && u.permOf(o) == u.permOf(n)
			switch {
			case samePerm && n.Kind == chunkstore.KindDir:
				err = u.diffDir(cp, append(slices.Clip(up), u.permOf(n)), o.ID, n.ID)
			case samePerm && o.ID == n.ID:
				// same file version, same permissions: nothing changed
			default:
				if err = u.remove(cp, o); err == nil {
					err = u.add(cp, up, n)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func childPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
