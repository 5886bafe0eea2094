package test

import (
	"bytes"
	iofs "io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	kfs "github.com/kylix/kylix/fs"
)

// What any FUSE server could do with small files on this machine (issue
// 20, item 1; docs/bench.md, "The FUSE floor for small files"). The
// small-files tree of TestBenchFirstPass is loaded into memory and served
// by floorFS, a server with no work of its own: go-fuse's raw API, a
// static node table, Kylix's mount options. Each side is timed on its
// first pass after a fresh mount (the kernel knows no inode and holds no
// page, as after a node start) and on the second, warm, pass; the sides
// beside ext4 in the same run, interleaved:
//
//   - floor, no-open (Kylix's read-only mount's settings: OPEN and FLUSH
//     answered ENOSYS, listings kept by the kernel), every file a READ
//     answered from memory;
//   - floor, no-open, ideal prefetch: a directory's files stored in the
//     kernel's page cache (FUSE_NOTIFY_STORE, from memory, in parallel
//     batches) as soon as the kernel has their inodes (at the next
//     READDIRPLUS of the listing and when it is closed); the bound for
//     Kylix's directory prefetch, whose passes read, verify and store the
//     same bytes;
//   - Kylix, serve --read-only;
//   - floor, an OPEN a file (answered KEEP_CACHE|NOFLUSH, as Kylix's
//     read-write mount answers for a committed file): the bound for a
//     mount that must see each open;
//   - Kylix, read-write mount.
//
// And a walk with lstat of the tree after a mount or start (the listing
// alone): ext4, the floor, Kylix read-only.
//
//	KYLIX_BENCH=1 go test -ldflags=-checklinkname=0 ./test -run 'TestBenchFirstPassFloor$' -count=1 -v
func TestBenchFirstPassFloor(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1")
	}
	requireFUSE(t)
	nSmall, reps := envInt("KYLIX_BENCH_SMALL", 10000), envInt("KYLIX_BENCH_REPS", 5)
	base := t.TempDir()
	src := filepath.Join(base, "small")
	writeSmallFiles(t, src, nSmall, 20)
	data, mnt, fmnt := filepath.Join(base, "data"), filepath.Join(base, "mnt"), filepath.Join(base, "floor")
	mustKylix(t, base, "import", "--data", data, src, "small")
	tree := loadFloorTree(t, src)
	readTree(t, src)
	// The floor serves the source's bytes, every one.
	func() {
		f := mountFloor(t, tree, fmnt, false, false)
		defer f.unmount()
		n := 0
		require.NoError(t, filepath.WalkDir(src, func(p string, d iofs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			want, err := os.ReadFile(p)
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(fmnt, rel))
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "%s through the floor", rel)
			n++
			return nil
		}))
		require.Equal(t, nSmall, n)
	}()
	// Each side returns the first pass after a mount or a start and the
	// second, warm, pass on the same mount.
	floor := func(prefetch, opens bool) func(pass func(string) float64) (float64, float64) {
		return func(pass func(string) float64) (first, warm float64) {
			f := mountFloor(t, tree, fmnt, prefetch, opens)
			defer f.unmount()
			first = pass(fmnt)
			reads := f.reads.Load()
			warm = pass(fmnt)
			t.Logf("floor (prefetch %v, opens %v): READs in the first pass %d, in the second %d; OPENs in both %d; stores the kernel refused %d (first: %v)",
				prefetch, opens, reads, f.reads.Load()-reads, f.opened.Load(), f.storeErr.Load(), fuse.Status(f.firstErr.Load()))
			// The floor is what it says: every file opened through it
			// when it answers OPEN, none otherwise; every file READ on
			// a first pass without prefetch.
			if opens {
				require.GreaterOrEqual(t, f.opened.Load(), int64(nSmall), "the floor that answers OPEN saw too few")
			} else {
				require.Zero(t, f.opened.Load(), "the no-open floor answered an OPEN")
			}
			if !prefetch && reads > 0 {
				require.GreaterOrEqual(t, reads, int64(nSmall), "a first pass without prefetch that READ too few files")
			}
			return first, warm
		}
	}
	kylix := func(args ...string) func(pass func(string) float64) (float64, float64) {
		return func(pass func(string) float64) (first, warm float64) {
			n := launchNode(t, data, mnt, nil, nil, args...)
			defer n.stop()
			first = pass(filepath.Join(mnt, "small"))
			return first, pass(filepath.Join(mnt, "small"))
		}
	}
	sides := []struct {
		name               string
		run                func(pass func(string) float64) (float64, float64)
		walk               bool // also time a walk with lstat after a mount or start
		first, warm, walks []float64
	}{
		{name: "floor, no-open, every file a READ from memory", run: floor(false, false), walk: true},
		{name: "floor, no-open, ideal prefetch", run: floor(true, false)},
		{name: "Kylix, serve --read-only", run: kylix("--read-only"), walk: true},
		{name: "floor, an OPEN a file (KEEP_CACHE, NOFLUSH)", run: floor(false, true)},
		{name: "Kylix, read-write mount", run: kylix()},
	}
	var ext4, ext4Walk []float64
	read := func(d string) float64 { return readTree(t, d) }
	walk := func(d string) float64 { return walkTree(t, d) }
	for range reps {
		ext4 = append(ext4, readTree(t, src))
		ext4Walk = append(ext4Walk, walkTree(t, src))
		for i := range sides {
			sd := &sides[i]
			f, w := sd.run(read)
			sd.first, sd.warm = append(sd.first, f), append(sd.warm, w)
			if sd.walk {
				f, _ = sd.run(walk)
				sd.walks = append(sd.walks, f)
			}
		}
	}
	e := median(ext4)
	t.Logf("%d small files (4-64 KiB), open+read+close, files/s, medians of %d; first pass after a mount or a start, then warm:", nSmall, reps)
	t.Logf("| ext4 (warm) | %.0f | 1 | %v |", e, ext4)
	for _, sd := range sides {
		t.Logf("| %s | first %.0f (%.2fx) | warm %.0f (%.2fx) | %v %v |", sd.name, median(sd.first), median(sd.first)/e, median(sd.warm), median(sd.warm)/e, sd.first, sd.warm)
	}
	t.Logf("walk with lstat of the same tree, s: ext4 (warm) %.3f %v", median(ext4Walk), ext4Walk)
	for _, sd := range sides {
		if sd.walk {
			t.Logf("  %s, after a mount or start: %.3f %v", sd.name, median(sd.walks), sd.walks)
		}
	}
}

// floorNode is one entry of floorFS's static table; its node ID is its
// index + 1 (the root is 1).
type floorNode struct {
	name     string
	dir      bool
	data     []byte
	children []uint64          // a directory's entries, in name order
	byName   map[string]uint64 // and by name
}

// loadFloorTree reads the tree at dir into memory.
func loadFloorTree(t *testing.T, dir string) []floorNode {
	t.Helper()
	nodes := []floorNode{{dir: true, byName: map[string]uint64{}}}
	var add func(parent uint64, path string)
	add = func(parent uint64, path string) {
		ents, err := os.ReadDir(path)
		require.NoError(t, err)
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			n := floorNode{name: e.Name(), dir: e.IsDir()}
			if n.dir {
				n.byName = map[string]uint64{}
			} else {
				n.data, err = os.ReadFile(filepath.Join(path, e.Name()))
				require.NoError(t, err)
			}
			nodes = append(nodes, n)
			id := uint64(len(nodes))
			p := &nodes[parent-1]
			p.children = append(p.children, id)
			p.byName[n.name] = id
			if n.dir {
				add(id, filepath.Join(path, e.Name()))
			}
		}
	}
	add(1, dir)
	return nodes
}

// floorFS serves a floorNode table read-only, doing nothing a kernel
// request does not need. With prefetch, closing a directory's listing
// stores all its files in the kernel's page cache, once per mount.
type floorFS struct {
	fuse.RawFileSystem
	nodes    []floorNode
	prefetch bool
	opens    bool // answer OPEN (else ENOSYS: no-open)
	srv      *fuse.Server
	mu       sync.Mutex
	stored   map[uint64]int // a directory's entries stored (or being stored)
	wg       sync.WaitGroup
	reads    atomic.Int64 // READs answered
	opened   atomic.Int64 // OPENs answered
	storeErr atomic.Int64 // stores the kernel refused
	firstErr atomic.Int32 // the first refusal's status
}

func mountFloor(t *testing.T, nodes []floorNode, dir string, prefetch, opens bool) *floorFS {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	f := &floorFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), nodes: nodes, prefetch: prefetch, opens: opens, stored: map[uint64]int{}}
	// Kylix's read-only mount's options (fs.FS.MountOptions, fs/readonly.go).
	mo := fuse.MountOptions{
		FsName: "kylix-floor", Name: "kylix-floor",
		MaxWrite: kfs.DefaultMaxIO, MaxReadAhead: kfs.DefaultMaxIO,
		DirectMount: true, DirectMountStrict: true, AllowOther: true,
		Options:       []string{"default_permissions"},
		MaxBackground: 64, DisableSplice: true,
		DirectMountFlags: syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_RDONLY,
	}
	srv, err := fuse.NewServer(f, dir, &mo)
	require.NoError(t, err)
	f.srv = srv
	go srv.Serve()
	require.NoError(t, srv.WaitMount())
	t.Cleanup(f.unmount)
	return f
}

func (f *floorFS) unmount() {
	if f.srv != nil {
		f.wg.Wait()
		f.srv.Unmount()
		f.srv = nil
	}
}

var floorTimeout = time.Hour

func (f *floorFS) node(id uint64) *floorNode {
	if id == 0 || id > uint64(len(f.nodes)) {
		return nil
	}
	return &f.nodes[id-1]
}

func (f *floorFS) attr(id uint64, a *fuse.Attr) {
	n := f.node(id)
	a.Ino = id
	if n.dir {
		a.Mode, a.Nlink = fuse.S_IFDIR|0o755, 2
	} else {
		a.Mode, a.Nlink, a.Size = fuse.S_IFREG|0o644, 1, uint64(len(n.data))
		a.Blocks = (a.Size + 511) / 512
	}
}

func (f *floorFS) entry(id uint64, out *fuse.EntryOut) {
	out.NodeId = id
	f.attr(id, &out.Attr)
	out.SetEntryTimeout(floorTimeout)
	out.SetAttrTimeout(floorTimeout)
}

func (f *floorFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	p := f.node(h.NodeId)
	if p == nil || !p.dir {
		return fuse.ENOTDIR
	}
	id, ok := p.byName[name]
	if !ok {
		return fuse.ENOENT
	}
	f.entry(id, out)
	return fuse.OK
}

func (f *floorFS) Forget(uint64, uint64) {}

func (f *floorFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if f.node(in.NodeId) == nil {
		return fuse.ENOENT
	}
	f.attr(in.NodeId, &out.Attr)
	out.SetTimeout(floorTimeout)
	return fuse.OK
}

// Open answers ENOSYS unless opens: the kernel then stops sending OPEN
// (no-open), as on Kylix's read-only mount. With opens, an OPEN keeps the
// page cache and asks for no FLUSH, as Kylix's read-write mount answers
// for a committed file; its RELEASE is answered at once.
func (f *floorFS) Open(_ <-chan struct{}, _ *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !f.opens {
		return fuse.ENOSYS
	}
	f.opened.Add(1)
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH
	return fuse.OK
}

func (f *floorFS) Release(<-chan struct{}, *fuse.ReleaseIn)         {}
func (f *floorFS) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status { return fuse.ENOSYS }

func (f *floorFS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	n := f.node(in.NodeId)
	if n == nil || n.dir {
		return nil, fuse.EINVAL
	}
	f.reads.Add(1)
	if in.Offset >= uint64(len(n.data)) {
		return fuse.ReadResultData(nil), fuse.OK
	}
	return fuse.ReadResultData(n.data[in.Offset:min(uint64(len(n.data)), in.Offset+uint64(in.Size))]), fuse.OK
}

func (f *floorFS) OpenDir(_ <-chan struct{}, _ *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	out.OpenFlags = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	return fuse.OK
}

func (f *floorFS) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, l *fuse.DirEntryList) fuse.Status {
	d := f.node(in.NodeId)
	f.storeListed(in.NodeId, int(in.Offset))
	for i := int(in.Offset); i < len(d.children); i++ {
		id := d.children[i]
		c := f.node(id)
		mode := uint32(fuse.S_IFREG)
		if c.dir {
			mode = fuse.S_IFDIR
		}
		eo := l.AddDirLookupEntry(fuse.DirEntry{Name: c.name, Mode: mode, Ino: id, Off: uint64(i + 1)})
		if eo == nil {
			break
		}
		f.entry(id, eo)
	}
	return fuse.OK
}

// storeListed stores, with prefetch, the files of directory dir among its
// first upTo entries not stored yet, in the background. The kernel has an
// inode for each entry of a READDIRPLUS reply once it asks for the next
// offset, and for all of them once the listing is closed: ReadDirPlus and
// ReleaseDir call this then, the earliest a server can store them.
func (f *floorFS) storeListed(dir uint64, upTo int) {
	if !f.prefetch {
		return
	}
	f.mu.Lock()
	from := f.stored[dir]
	upTo = min(upTo, len(f.node(dir).children))
	if upTo > from {
		f.stored[dir] = upTo
	}
	f.mu.Unlock()
	ids := f.node(dir).children[from:max(from, upTo)]
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 8)]
		ids = ids[len(batch):]
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for _, id := range batch {
				if c := f.node(id); !c.dir {
					if st := f.srv.InodeNotifyStoreCache(id, 0, c.data); st != fuse.OK && f.storeErr.Add(1) == 1 {
						f.firstErr.Store(int32(st))
					}
				}
			}
		}()
	}
}

func (f *floorFS) ReleaseDir(in *fuse.ReleaseIn) { f.storeListed(in.NodeId, math.MaxInt) }

func (f *floorFS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 255
	return fuse.OK
}
