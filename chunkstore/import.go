package chunkstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ImportOptions configure Store.Import.
type ImportOptions struct {
	// Progress is called as bytes are read: done so far and the total
	// found by the scan before the import started.
	Progress func(done, total int64)
	// OnFile is called after each file is stored.
	OnFile func(path string, r PutResult)
	// NoDereference stores every symlink as a link. By default a symlink
	// that leads out of the imported tree to a regular file is followed and
	// the file is stored under the link's name (rsync's
	// --copy-unsafe-links): a Hugging Face cache snapshot is a directory of
	// links into ../../blobs, which stored as links would dangle. Links
	// that stay inside the tree are kept as links, so a tree exported and
	// imported again is the same tree. Links out of the tree to
	// directories (following them could loop) and dangling links are kept
	// as links too, each listed in Notes. Run as root, a link out of the
	// tree is followed only to a file of the link's own owner (a user's
	// link to /etc/shadow is kept as a link, with a note); a followed
	// file is always stored with its own owner and mode, read from the
	// descriptor its bytes come from (docs/design/rootops.md).
	NoDereference bool
	// OnChunk, if set, is called with every chunk of every file as the
	// import reads it, in file order, new or already stored (a chunk
	// repeated in a file comes again each time). It runs on the importing
	// goroutine before the chunk is written, so a slow OnChunk slows the
	// import down (that is its backpressure), and data is valid only
	// during the call. A cluster member streams an import's chunks to
	// their owners through it (peers.PushStream).
	OnChunk func(id ID, data []byte)
}

// ImportResult sums up an import.
type ImportResult struct {
	Root     ID  `json:"root"` // manifest of what DEST now names
	Files    int `json:"files"`
	Dirs     int `json:"dirs"`
	Symlinks int `json:"symlinks"` // stored as links
	// Followed counts symlinks to regular files stored as those files
	// (ImportOptions.NoDereference off).
	Followed   int   `json:"symlinks_followed"`
	Bytes      int64 `json:"bytes"`
	NewBytes   int64 `json:"new_bytes"`
	DedupBytes int64 `json:"dedup_bytes"`
	// Hardlinks counts the names of files met again by another name
	// (files with several links): stored as names of one link set, as
	// the tree has them.
	Hardlinks int `json:"hardlinks"`
	// Special counts fifos, sockets and device nodes, stored as metadata
	// (type, mode, owner, mtime, device number).
	Special int `json:"special"`
	// Skipped lists sources that could not be stored (a type the
	// namespace has no kind for), with the reason.
	Skipped []string `json:"skipped,omitempty"`
	// Notes lists files stored differently than their names suggest (a
	// .safetensors file with a malformed header, for instance).
	Notes []string `json:"notes,omitempty"`
}

// sourceError words a failure to find the source of an import: the path
// once, and the system's reason (ENOENT, EACCES: errors.Is sees them).
func sourceError(src string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("import source %s: %w", src, err)
}

// beforeImportNames, when set (tests), runs in Import after its commit and
// before the namespace names what it wrote.
var beforeImportNames func(*Store)

// Import stores the file or directory tree at src (a local path) under the
// namespace path dest, replacing whatever dest named before. Nothing is
// visible under dest until everything has been stored: the namespace changes
// in one transaction at the end, so an import interrupted at any point leaves
// dest as it was.
//
// src itself is resolved by the kernel as named (a symlink at src is
// followed unless opts.NoDereference). Below it, the tree is walked by
// directory descriptors: each entry is opened relative to its parent's
// descriptor without following links (O_PATH|O_NOFOLLOW), and its kind,
// owner, group, mode and bytes all come from that one descriptor, so
// renaming or swapping entries for symlinks while root imports a user's
// tree cannot make one file's bytes be stored with another's owner or mode
// (docs/design/rootops.md).
func (s *Store) Import(ctx context.Context, src, dest string, opts ImportOptions) (ImportResult, error) {
	var res ImportResult
	parts, err := SplitPath(dest)
	if err != nil {
		return res, fmt.Errorf("import to %q: %w", dest, err)
	}
	if len(parts) == 0 {
		return res, fmt.Errorf("import to %q: name a path inside the namespace, such as models/NAME: %w", dest, ErrInvalidPath)
	}
	flags := unix.O_PATH
	if opts.NoDereference {
		flags |= unix.O_NOFOLLOW
	}
	// SRC named as a link is followed, as cp and tar follow the operands
	// they are given.
	fd, err := openat(unix.AT_FDCWD, src, flags, 0)
	if err != nil {
		return res, sourceError(src, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return res, sourceError(src, err)
	}
	var total int64
	if err := scanSize(fd, &st, !opts.NoDereference, &total); err != nil {
		return res, fmt.Errorf("import %s: %w", src, err)
	}
	var done int64
	progress := func(n int64) {
		done += n
		s.ctr.importBytes.Add(n)
		if opts.Progress != nil {
			opts.Progress(done, total)
		}
	}
	im := s.NewImporter()
	defer im.Abort()
	im.onChunk = opts.OnChunk
	w := &importWalk{s: s, im: im, res: &res, opts: opts, progress: progress, src: src, asRoot: os.Geteuid() == 0}
	e, err := w.opened(ctx, fd, &st, unix.AT_FDCWD, src, filepath.Base(src), "")
	if err != nil {
		return res, err
	}
	if e.Kind == 0 {
		return res, fmt.Errorf("import %s: %s is not a file type the namespace stores", src, fileMode(st.Mode).Type())
	}
	// Commit what was written, name it, and only then let GC run (Close):
	// a GC between the commit and the naming would find the new chunks
	// and manifests unreachable and delete them under the import.
	if err := im.Flush(); err != nil {
		return res, err
	}
	if beforeImportNames != nil {
		beforeImportNames(s)
	}
	res.Root = e.ID
	err = s.Update(func(tx *NSTx) error {
		if len(w.setEnts) > 0 {
			t, err := tx.table(true)
			if err != nil {
				return err
			}
			for _, se := range w.setEnts {
				t.m.Put(se)
			}
		}
		return tx.Put(dest, e)
	})
	if err != nil {
		return res, fmt.Errorf("import to %s: %w", dest, err)
	}
	if err := im.Close(); err != nil {
		return res, err
	}
	return res, nil
}

// scanSize adds up the bytes the import will read (for its progress), with
// the files that followed symlinks name. It walks by descriptors as the
// import does, but only stats: the import itself decides what is read.
func scanSize(fd int, st *unix.Stat_t, follow bool, total *int64) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		*total += st.Size
		return nil
	case unix.S_IFDIR:
	default:
		return nil
	}
	dfd, err := openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dfd), ".")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		var cst unix.Stat_t
		if err := unix.Fstatat(dfd, name, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone, or not ours to see: the import says so
		}
		switch cst.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			*total += cst.Size
		case unix.S_IFLNK:
			// An estimate for the progress bar: links inside the tree
			// are counted too, though they are not followed.
			if follow && unix.Fstatat(dfd, name, &cst, 0) == nil && cst.Mode&unix.S_IFMT == unix.S_IFREG {
				*total += cst.Size
			}
		case unix.S_IFDIR:
			cfd, err := openBeneath(dfd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				continue
			}
			err = scanSize(cfd, &cst, follow, total)
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// importWalk is one import's walk of its source tree.
type importWalk struct {
	s        *Store
	im       *Importer
	res      *ImportResult
	opts     ImportOptions
	progress func(int64)
	src      string // SRC as named, for messages
	asRoot   bool
	// sets are the link sets found so far: regular files with more than
	// one link, by device and inode (hardlinks.md, "Import").
	sets    map[[2]uint64]uint64
	setEnts map[uint64]Entry
}

// path names the entry at rel for messages.
func (w *importWalk) path(rel string) string {
	if rel == "" {
		return w.src
	}
	return filepath.Join(w.src, filepath.FromSlash(rel))
}

// entry imports name, a child of the directory dirfd at rel. A zero Kind
// means skipped (gone, or neither file, directory nor link).
func (w *importWalk) entry(ctx context.Context, dirfd int, name, rel string) (Entry, error) {
	fd, err := openBeneath(dirfd, name, unix.O_PATH, 0)
	if errors.Is(err, unix.ENOENT) {
		return Entry{}, nil // removed while we read the directory
	}
	if err != nil {
		return Entry{}, fmt.Errorf("import %s: %w", w.path(rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, fmt.Errorf("import %s: %w", w.path(rel), err)
	}
	return w.opened(ctx, fd, &st, dirfd, name, name, rel)
}

// opened imports the entry open as the O_PATH descriptor fd, whose fstat is
// st: name in dirfd, stored as entryName. Everything recorded comes from st
// and everything read from fd's inode.
func (w *importWalk) opened(ctx context.Context, fd int, st *unix.Stat_t, dirfd int, name, entryName, rel string) (Entry, error) {
	if err := ctxErr(ctx); err != nil {
		return Entry{}, err
	}
	// The source's owner, group and full mode (setuid, setgid, sticky
	// included) are recorded as they are, as cp -a would keep them.
	e := Entry{Name: entryName, Mode: fileMode(st.Mode) & EntryModeMask, UID: st.Uid, GID: st.Gid, MTime: st.Mtim.Nano()}
	p := w.path(rel)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		key := [2]uint64{st.Dev, st.Ino}
		if rel != "" && st.Nlink > 1 {
			if l, ok := w.sets[key]; ok {
				// Another name of a file already stored: a name of
				// its link set, nothing read again.
				se := w.setEnts[l]
				se.Nlink++
				w.setEnts[l] = se
				w.res.Hardlinks++
				return Entry{Name: entryName, Kind: KindHardlink, Link: l}, nil
			}
		}
		f, err := reopen(fd, st, dirfd, name, rel == "" && !w.opts.NoDereference)
		if err != nil {
			return e, fmt.Errorf("import %s: %w", p, err)
		}
		err = w.putFile(ctx, f, &e, entryName, rel, p)
		f.Close()
		if err != nil || rel == "" || st.Nlink < 2 {
			return e, err
		}
		l, err := newLinkID()
		if err != nil {
			return e, err
		}
		if w.sets == nil {
			w.sets, w.setEnts = map[[2]uint64]uint64{}, map[uint64]Entry{}
		}
		se := e
		se.Name, se.Nlink, se.HLC = linkName(l), 1, w.s.clock.Now()
		w.sets[key], w.setEnts[l] = l, se
		return Entry{Name: entryName, Kind: KindHardlink, Link: l}, nil
	case unix.S_IFDIR:
		return e, w.dir(ctx, fd, &e, rel, p)
	case unix.S_IFLNK:
		return w.link(ctx, fd, st, dirfd, name, e, rel, p)
	case unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFCHR, unix.S_IFBLK:
		// Metadata only, from the fstat of the O_PATH descriptor: the
		// node itself is never opened.
		e.Kind = map[uint32]Kind{unix.S_IFIFO: KindFifo, unix.S_IFSOCK: KindSocket, unix.S_IFCHR: KindCharDev, unix.S_IFBLK: KindBlockDev}[st.Mode&unix.S_IFMT]
		if e.Kind.IsDevice() {
			e.Rdev = st.Rdev
		}
		w.res.Special++
		return e, nil
	}
	if rel != "" {
		w.res.Skipped = append(w.res.Skipped, fmt.Sprintf("%s: %s is not a file type the namespace stores", p, fileMode(st.Mode).Type()))
	}
	return Entry{}, nil
}

// putFile stores the open regular file f as e.
func (w *importWalk) putFile(ctx context.Context, f *os.File, e *Entry, name, rel, p string) error {
	r, err := w.im.PutFile(ctx, f, name, w.progress)
	if err != nil {
		return err
	}
	e.Kind, e.ID, e.Size = KindFile, r.ID, r.Size
	w.res.Files++
	w.res.Bytes += r.Size
	w.res.NewBytes += r.NewBytes
	w.res.DedupBytes += r.DedupBytes
	if r.FormatNote != "" {
		w.res.Notes = append(w.res.Notes, fmt.Sprintf("%s: %s", p, r.FormatNote))
	}
	if w.opts.OnFile != nil {
		w.opts.OnFile(rel, r)
	}
	return nil
}

// dir imports the directory open as the O_PATH descriptor fd, entry by
// entry relative to it.
func (w *importWalk) dir(ctx context.Context, fd int, e *Entry, rel, p string) error {
	dfd, err := openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("import %s: %w", p, err)
	}
	d := os.NewFile(uintptr(dfd), p)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("import %s: %w", p, err)
	}
	sort.Strings(names)
	m := &DirManifest{}
	for _, name := range names {
		if err := checkName(name); err != nil {
			return fmt.Errorf("import %s: %w", p, err)
		}
		c, err := w.entry(ctx, dfd, name, joinPath(rel, name))
		if err != nil {
			return err
		}
		if c.Kind == 0 {
			continue
		}
		c.HLC = w.s.clock.Now()
		m.Entries = append(m.Entries, c)
	}
	e.Kind = KindDir
	e.ID = w.im.PutObject(m.Encode())
	w.res.Dirs++
	return nil
}

// link imports the symlink open as the O_PATH|O_NOFOLLOW descriptor fd
// (name in dirfd), e being the link's own entry. It is stored as a link,
// or, when it leads out of the tree to a regular file and links are
// followed, as that file (see followTarget).
func (w *importWalk) link(ctx context.Context, fd int, st *unix.Stat_t, dirfd int, name string, e Entry, rel, p string) (Entry, error) {
	t, err := readlinkFd(fd)
	if err != nil {
		return e, fmt.Errorf("import %s: %w", p, err)
	}
	if len(t) == 0 || len(t) > MaxSymlinkLen {
		return e, fmt.Errorf("import %s: symlink target of %d bytes: %w", p, len(t), ErrInvalidPath)
	}
	// SRC itself is a link here only with NoDereference: followed, it
	// was opened as what it names.
	if !w.opts.NoDereference && rel != "" && leadsOut(rel, t) {
		f, err := w.followTarget(fd, st, dirfd, name, p)
		if err != nil {
			return e, err
		}
		if f != nil {
			// Stored as the file it names, under the link's name, with
			// the file's owner and mode (the link's own are meaningless).
			var fst unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
				f.Close()
				return e, fmt.Errorf("import %s: %w", p, err)
			}
			fe := Entry{Name: e.Name, Mode: fileMode(fst.Mode) & EntryModeMask, UID: fst.Uid, GID: fst.Gid, MTime: fst.Mtim.Nano()}
			err = w.putFile(ctx, f, &fe, e.Name, rel, p)
			f.Close()
			if err == nil {
				w.res.Followed++
			}
			return fe, err
		}
	}
	e.Kind, e.Target, e.Size = KindSymlink, t, int64(len(t))
	w.res.Symlinks++
	return e, nil
}

// followTarget opens, for reading, the regular file the link name in dirfd
// (owned per lst) leads to, or returns nil (noted in the result) when the
// link is to be kept as a link: its target is missing, a directory (which
// could loop), not a regular file, or, when importing as root, a file of
// another owner than the link's. That last rule is the kernel's
// protected_symlinks applied everywhere: a user's link to /etc/shadow is
// not root's to follow. Whatever the link is swapped for meanwhile, the file
// returned is the one whose fstat was checked.
func (w *importWalk) followTarget(lfd int, lst *unix.Stat_t, dirfd int, name, p string) (*os.File, error) {
	keep := func(why string) (*os.File, error) {
		w.res.Notes = append(w.res.Notes, fmt.Sprintf("%s: kept as a symlink: %s", p, why))
		return nil, nil
	}
	tfd, err := openFollow(dirfd, name, unix.O_PATH)
	if err != nil {
		return keep(fmt.Sprintf("its target cannot be read (%v)", err))
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstat(tfd, &st); err != nil {
		return keep(fmt.Sprintf("its target cannot be read (%v)", err))
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return keep("it names a directory outside the tree, which is not followed")
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return keep(fmt.Sprintf("it names a %s", fileMode(st.Mode).Type()))
	case w.asRoot && st.Uid != lst.Uid:
		return keep(fmt.Sprintf("it leads out of the tree to a file of uid %d, and the link is uid %d's; run as root, import follows a link only to a file of the link's own owner", st.Uid, lst.Uid))
	}
	f, err := reopen(tfd, &st, dirfd, name, true)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", p, err)
	}
	return f, nil
}

// leadsOut reports whether the symlink at rel (a slash-separated path
// inside the tree) with target t leads out of the tree. It is decided on
// the link's own target, as rsync decides which links are "unsafe": an
// absolute target, or a relative one that climbs out of the tree, leads
// out. A link inside the tree to a file that is itself a link out
// (config.json -> ../../blobs/X, cfg -> config.json) is kept: its target
// is imported in its own right.
func leadsOut(rel, t string) bool {
	if path.IsAbs(t) {
		return true
	}
	j := path.Join(path.Dir(rel), t)
	return j == ".." || strings.HasPrefix(j, "../")
}

// ExportOptions configure Store.Export.
type ExportOptions struct {
	Progress func(done, total int64)
	// Overwrite replaces existing files at the destination.
	Overwrite bool
	// Note, if set, receives one line for each recorded attribute export
	// could not restore (setuid/setgid bits and owners, when not run as
	// root).
	Note func(msg string)
}

// Export writes the file or tree at namespace path src to the local path dest,
// byte for byte, verifying every chunk. Each file is written to a temporary
// name and renamed into place once complete, so a failed export never leaves
// a file with wrong or missing bytes under its real name.
//
// dest's parent directory is opened once (run as root, through no symlink
// another user owns: ErrUnsafeSymlink); everything below it is created and
// opened relative to its parent's descriptor without following symlinks,
// and owners, modes and times are set on the descriptors. So a user who
// owns a directory on the way and swaps entries for symlinks mid-export can
// make it fail, never write anywhere but beneath that directory
// (docs/design/rootops.md). If src is a file and dest an existing
// directory (not a symlink to one), the file is written into it.
func (s *Store) Export(ctx context.Context, src, dest string, opts ExportOptions) (files int, bytes int64, err error) {
	e, err := s.Lookup(src)
	if err != nil {
		return 0, 0, err
	}
	var total int64
	clean, _ := CleanPath(src)
	if err := s.walk(clean, e, func(_ string, c Entry) error {
		if c.Kind == KindFile {
			total += c.Size
		}
		return nil
	}); err != nil {
		return 0, 0, err
	}
	var done int64
	progress := func(n int64) {
		done += n
		s.ctr.exportBytes.Add(n)
		if opts.Progress != nil {
			opts.Progress(done, total)
		}
	}
	dir, name := filepath.Split(filepath.Clean(dest))
	if name == "" || name == string(filepath.Separator) {
		return 0, 0, fmt.Errorf("export to %s: name a directory below it: %w", dest, fs.ErrExist)
	}
	dirfd, err := openDestDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("export to %s: %w", dest, err)
	}
	defer func() { unix.Close(dirfd) }()
	if e.Kind == KindFile && e.Name != "" {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := openBeneath(dirfd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				return 0, 0, fmt.Errorf("export to %s: %w", dest, err)
			}
			unix.Close(dirfd)
			dirfd, name, dest = sub, e.Name, filepath.Join(dest, e.Name)
		}
	}
	x := &exportLinks{first: map[uint64]int{}}
	defer x.close()
	err = s.exportEntry(ctx, e, clean, x, dirfd, name, dest, opts, progress, &files, &bytes)
	return files, bytes, err
}

// exportEntry writes e as name in the directory dirfd (dest, for messages).
// nsPath is e's namespace path; x holds the link sets exported so far.
func (s *Store) exportEntry(ctx context.Context, e Entry, nsPath string, x *exportLinks, dirfd int, name, dest string, opts ExportOptions, progress func(int64), files *int, bytes *int64) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	if e.Link != 0 && e.Kind != KindDir {
		// Another name of a link set already exported: a hard link
		// to that file (rootops.go).
		if fd, ok := x.first[e.Link]; ok {
			if opts.Overwrite {
				if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
					return fmt.Errorf("export %s: %w", dest, err)
				}
			}
			if err := linkFd(fd, dirfd, name); err != nil {
				return fmt.Errorf("export %s: hard link: %w", dest, err)
			}
			return nil
		}
		defer x.remember(e, dirfd, name)
	}
	switch e.Kind {
	case KindDir:
		if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && err != unix.EEXIST {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		// Never write through a symlink planted where a directory goes
		// (a root export into a shared directory would follow it
		// anywhere): the directory is opened once, without following,
		// and filled through that descriptor.
		fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err == unix.ELOOP || err == unix.ENOTDIR {
			return fmt.Errorf("export %s: exists and is not a directory (symlinks are not followed): %w", dest, fs.ErrExist)
		}
		if err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		dir := os.NewFile(uintptr(fd), dest)
		defer dir.Close()
		d, err := s.dirAt(e.ID)
		if err != nil {
			return err
		}
		live, err := s.liveEntries(nsPath, d, &x.table)
		if err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		for _, c := range live {
			if err := checkName(c.Name); err != nil {
				return fmt.Errorf("export %s: %w", dest, err)
			}
			if err := s.exportEntry(ctx, c, joinPath(nsPath, c.Name), x, fd, c.Name, filepath.Join(dest, c.Name), opts, progress, files, bytes); err != nil {
				return err
			}
		}
		if e.Mode != 0 {
			// Restored after the entries, so that a read-only directory
			// could still be filled.
			if err := restoreMeta(dir, e, dest, opts); err != nil {
				return err
			}
		}
	case KindSymlink:
		if opts.Overwrite {
			// Removes a symlink or file itself, never a link's target.
			if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
				return fmt.Errorf("export %s: %w", dest, err)
			}
		}
		if err := unix.Symlinkat(e.Target, dirfd, name); err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		if os.Geteuid() == 0 && e.UID != OwnerUnknown {
			// Through a descriptor of the link itself (O_PATH|O_NOFOLLOW),
			// checked to be a symlink: never whatever was renamed there.
			fd, err := openBeneath(dirfd, name, unix.O_PATH, 0)
			if err != nil {
				return fmt.Errorf("export %s: owner: %w", dest, err)
			}
			var st unix.Stat_t
			err = unix.Fstat(fd, &st)
			if err == nil && st.Mode&unix.S_IFMT != unix.S_IFLNK {
				err = fmt.Errorf("replaced while being exported: %w", fs.ErrExist)
			}
			if err == nil {
				err = unix.Fchownat(fd, "", int(e.UID), int(e.GID), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
			}
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("export %s: owner: %w", dest, err)
			}
		}
	case KindFifo, KindSocket, KindCharDev, KindBlockDev:
		if opts.Overwrite {
			// Removes what is at name itself, never a link's target; a
			// directory there stays (and mknod then fails).
			if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT && err != unix.EISDIR {
				return fmt.Errorf("export %s: %w", dest, err)
			}
		}
		if e.Kind.IsDevice() && os.Geteuid() != 0 {
			// mknod(2) of a device needs CAP_MKNOD: not an error for
			// the rest of the tree, but said.
			if opts.Note != nil {
				opts.Note(fmt.Sprintf("%s: %v %d:%d not created (export is not running as root; making a device node needs CAP_MKNOD)", dest, e.Kind, unix.Major(e.Rdev), unix.Minor(e.Rdev)))
			}
			return nil
		}
		if err := mknodBeneath(dirfd, name, e, exportMode(e, dest, opts)); err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
	case KindFile:
		if !opts.Overwrite {
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
				return fmt.Errorf("export %s: %w", dest, fs.ErrExist)
			}
		}
		f, err := s.OpenFile(e.ID)
		if err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		out, tmp, err := createTemp(dirfd, name)
		if err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		n, err := f.WriteTo(ctx, out, progress)
		if err == nil {
			err = restoreMeta(out, e, dest, opts)
		}
		if err == nil && e.MTime != 0 {
			err = futimens(out, timeFromNanos(e.MTime))
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			// Within the one directory descriptor: rename replaces a
			// symlink at name, it does not write through it.
			err = unix.Renameat(dirfd, tmp, dirfd, name)
		}
		if err != nil {
			_ = unix.Unlinkat(dirfd, tmp, 0) // ours: created with O_EXCL under a random name
			if errors.Is(err, syscall.ENOSPC) {
				return fmt.Errorf("export %s: disk full: %w", dest, err)
			}
			return fmt.Errorf("export %s: %w", dest, err)
		}
		*files++
		*bytes += n
	}
	return nil
}

// restoreMeta gives the open file or directory f (exported to dest) the
// owner, group and mode entry e records. As root, owner and group come
// first (fchown), then the full mode: chown clears setuid and setgid, so
// the other order would lose them. Not as root, owners are left to the
// user running export and the mode is restored without setuid and
// setgid, which would otherwise grant that user's rights rather than the
// recorded owner's; each bit dropped is reported through opts.Note.
func restoreMeta(f *os.File, e Entry, dest string, opts ExportOptions) error {
	if os.Geteuid() == 0 && e.UID != OwnerUnknown {
		if err := f.Chown(int(e.UID), int(e.GID)); err != nil {
			return fmt.Errorf("export %s: owner: %w", dest, err)
		}
	}
	if err := f.Chmod(exportMode(e, dest, opts)); err != nil {
		return fmt.Errorf("export %s: mode: %w", dest, err)
	}
	return nil
}

// exportMode is the mode export gives e: the recorded one, less setuid
// and setgid when not run as root (see restoreMeta), which is noted.
func exportMode(e Entry, dest string, opts ExportOptions) fs.FileMode {
	mode := e.Mode & EntryModeMask
	if os.Geteuid() != 0 && mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
		mode &^= fs.ModeSetuid | fs.ModeSetgid
		if opts.Note != nil {
			opts.Note(fmt.Sprintf("%s: setuid/setgid not restored (recorded mode %#o; export is not running as root, so owners are not restored either)", dest, UnixMode(e.Mode)))
		}
	}
	return mode
}

// createTemp creates a new file in the directory dirfd, next to name,
// under a random name, with O_EXCL|O_NOFOLLOW: a symlink planted at any
// name (predictable or not) is never followed, and an existing file is
// never reused. The file is renamed over name, within dirfd, when complete.
func createTemp(dirfd int, name string) (*os.File, string, error) {
	for range 100 {
		var r [8]byte
		if _, err := rand.Read(r[:]); err != nil {
			return nil, "", err
		}
		tmp := "." + name + ".kylix-" + hex.EncodeToString(r[:])
		if len(tmp) > 255 {
			tmp = ".kylix-" + hex.EncodeToString(r[:])
		}
		fd, err := openBeneath(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == unix.EEXIST {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("create a temporary file next to %s: %w", name, err)
		}
		return os.NewFile(uintptr(fd), tmp), tmp, nil
	}
	return nil, "", fmt.Errorf("create a temporary file next to %s: %w", name, fs.ErrExist)
}

// futimens sets f's access and modification times through its descriptor,
// so no path (which could be swapped for a symlink) is involved.
func futimens(f *os.File, t time.Time) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, f.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return &os.PathError{Op: "futimens", Path: f.Name(), Err: errno}
	}
	return nil
}
