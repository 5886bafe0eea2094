package fs

// The rule for shared packs handed to clients (docs/design/preload.md): a
// pack that holds bytes of several files is given to a process only if
// that process may read every one of those files, as the kernel would
// decide with default_permissions (mode, owner, group and supplementary
// groups, and search permission on every directory above the file). The
// caller's identity comes from SO_PEERCRED and /proc/PID/status.

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

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
}

// PackTable is the file's pack table (the order of KYLIX_IOC_CHUNKS'
// pack_index and of KYLIX_IOC_PACK).
func PackTable(sf *chunkstore.File) []uint64 { return packTable(sf) }

// PackReadableBy reports whether c may read every file of the namespace
// that has bytes in pack. The first call after a namespace change walks
// the namespace and each file's chunk locations (cost: one index lookup
// per chunk of every file); later calls are map lookups.
func (f *FS) PackReadableBy(pack uint64, c Cred) (bool, error) {
	// A chmod or chown through the mount reaches the store through the
	// committer: wait for what is queued, so the walk sees it.
	if err := f.com.wait(f.com.barrier()); err != nil {
		return false, fmt.Errorf("commit pending changes before deciding who may read a pack: %w", err)
	}
	r := &f.readers
	r.mu.Lock()
	defer r.mu.Unlock()
	root, _, err := f.s.Root()
	if err != nil {
		return false, fmt.Errorf("read the namespace root: %w", err)
	}
	if r.chains == nil || r.root != root {
		chains, err := f.packChains()
		if err != nil {
			return false, err
		}
		r.root, r.chains = root, chains
	}
	for _, chain := range r.chains[pack] {
		for i, p := range chain {
			want := uint32(1) // search a directory
			if i == len(chain)-1 {
				want = 4 // read the file
			}
			if !p.allows(c, want) {
				return false, nil
			}
		}
	}
	return true, nil
}

// packChains walks the namespace: for each file, its access chain, filed
// under every pack that holds some of its bytes.
func (f *FS) packChains() (map[uint64][][]perm, error) {
	dirs := map[string][]perm{"": nil} // path -> chain of the directories down to it, inclusive
	packsOf := map[chunkstore.ID][]uint64{}
	out := map[uint64][][]perm{}
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
		}
		chain := append(slices.Clip(up), permOf(e))
		for _, pk := range packs {
			out[pk] = append(out[pk], chain)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find who may read each pack: %w", err)
	}
	return out, nil
}
