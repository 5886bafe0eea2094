package chunkstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
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
	// as links too, each listed in Notes.
	NoDereference bool
	// OnChunk, if set, is called with every chunk of every file as the
	// import reads it, in file order, new or already stored (a chunk
	// repeated in a file comes again each time). It runs on the importing
	// goroutine before the chunk is written, so a slow OnChunk slows the
	// import down (that is its backpressure), and data is valid only
	// during the call. A cluster member streams an import's chunks to
	// their owners through it (peers.PushStream).
	OnChunk func(id ID, data []byte)

	root string // the imported tree, absolute (set by Import)
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
	// Skipped lists sources that are neither regular files, directories nor
	// symlinks (sockets, devices, FIFOs), with the reason.
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

// Import stores the file or directory tree at src (a local path) under the
// namespace path dest, replacing whatever dest named before. Nothing is
// visible under dest until everything has been stored: the namespace changes
// in one transaction at the end, so an import interrupted at any point leaves
// dest as it was.
func (s *Store) Import(ctx context.Context, src, dest string, opts ImportOptions) (ImportResult, error) {
	var res ImportResult
	parts, err := SplitPath(dest)
	if err != nil {
		return res, fmt.Errorf("import to %q: %w", dest, err)
	}
	if len(parts) == 0 {
		return res, fmt.Errorf("import to %q: name a path inside the namespace, such as models/NAME: %w", dest, ErrInvalidPath)
	}
	st, err := os.Lstat(src)
	if err != nil {
		return res, sourceError(src, err)
	}
	if st.Mode()&fs.ModeSymlink != 0 && !opts.NoDereference {
		// SRC named as a link is followed, as cp and tar follow the
		// operands they are given.
		if st, err = os.Stat(src); err != nil {
			return res, sourceError(src, err)
		}
	}
	if opts.root, err = filepath.Abs(src); err != nil {
		return res, fmt.Errorf("import %s: %w", src, err)
	}
	var total int64
	if err := scanSize(src, !opts.NoDereference, &total); err != nil {
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
	e, err := s.importEntry(ctx, im, src, st, "", &res, opts, progress)
	if err != nil {
		return res, err
	}
	if err := im.Close(); err != nil {
		return res, err
	}
	res.Root = e.ID
	err = s.Update(func(tx *NSTx) error {
		return tx.Put(dest, e)
	})
	if err != nil {
		return res, fmt.Errorf("import to %s: %w", dest, err)
	}
	return res, nil
}

// scanSize adds up the bytes the import will read (for its progress), with
// the files that followed symlinks name.
func scanSize(src string, follow bool, total *int64) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			*total += info.Size()
		case d.Type()&fs.ModeSymlink != 0 && follow:
			// An estimate for the progress bar: links inside the tree
			// are counted too, though they are not followed.
			if info, err := os.Stat(p); err == nil && info.Mode().IsRegular() {
				*total += info.Size()
			}
		}
		return nil
	})
}

func (s *Store) importEntry(ctx context.Context, im *Importer, src string, st fs.FileInfo, rel string, res *ImportResult, opts ImportOptions, progress func(int64)) (Entry, error) {
	if err := ctxErr(ctx); err != nil {
		return Entry{}, err
	}
	// The source's owner, group and full mode (setuid, setgid, sticky
	// included) are recorded as they are, as cp -a would keep them.
	e := Entry{Name: st.Name(), Mode: st.Mode() & EntryModeMask, UID: OwnerUnknown, GID: OwnerUnknown, MTime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = sys.Uid, sys.Gid
	}
	switch {
	case st.Mode().IsRegular():
		f, err := os.Open(src)
		if err != nil {
			return e, fmt.Errorf("import %s: %w", src, err)
		}
		r, err := im.PutFile(ctx, f, st.Name(), progress)
		f.Close()
		if err != nil {
			return e, err
		}
		e.Kind, e.ID, e.Size = KindFile, r.ID, r.Size
		res.Files++
		res.Bytes += r.Size
		res.NewBytes += r.NewBytes
		res.DedupBytes += r.DedupBytes
		if r.FormatNote != "" {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: %s", src, r.FormatNote))
		}
		if opts.OnFile != nil {
			opts.OnFile(rel, r)
		}
	case st.Mode()&fs.ModeSymlink != 0 && !opts.NoDereference && followable(src, opts.root, res):
		target, err := os.Stat(src)
		if err != nil {
			return e, fmt.Errorf("import %s: %w", src, err)
		}
		// Stored as the file it names, under the link's name, with the
		// file's owner and mode (the link's own are meaningless).
		f, err := s.importEntry(ctx, im, src, namedInfo{target, st.Name()}, rel, res, opts, progress)
		if err == nil {
			res.Followed++
		}
		return f, err
	case st.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return e, fmt.Errorf("import %s: %w", src, err)
		}
		if len(t) == 0 || len(t) > maxSymlink {
			return e, fmt.Errorf("import %s: symlink target of %d bytes: %w", src, len(t), ErrInvalidPath)
		}
		e.Kind, e.Target, e.Size = KindSymlink, t, int64(len(t))
		res.Symlinks++
	case st.IsDir():
		ents, err := os.ReadDir(src)
		if err != nil {
			return e, fmt.Errorf("import %s: %w", src, err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		m := &DirManifest{}
		for _, de := range ents {
			if err := checkName(de.Name()); err != nil {
				return e, fmt.Errorf("import %s: %w", src, err)
			}
			info, err := de.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed while we read the directory
			}
			if err != nil {
				return e, fmt.Errorf("import %s: %w", src, err)
			}
			if !info.Mode().IsRegular() && !info.IsDir() && info.Mode()&fs.ModeSymlink == 0 {
				res.Skipped = append(res.Skipped, fmt.Sprintf("%s: %s is not a regular file, directory or symlink", filepath.Join(src, de.Name()), info.Mode().Type()))
				continue
			}
			c, err := s.importEntry(ctx, im, filepath.Join(src, de.Name()), info, joinPath(rel, de.Name()), res, opts, progress)
			if err != nil {
				return e, err
			}
			c.HLC = s.clock.Now()
			m.Entries = append(m.Entries, c)
		}
		e.Kind = KindDir
		e.ID = im.PutObject(m.Encode())
		res.Dirs++
	default:
		return e, fmt.Errorf("import %s: %s is not a regular file, directory or symlink", src, st.Mode().Type())
	}
	return e, nil
}

// followable reports whether the symlink at src is to be followed: it
// leads out of the imported tree (root) to a regular file. A link to a
// directory outside the tree or a dangling one is noted in res and kept as
// a link; a link inside the tree is kept without a note.
//
// Inside or out is decided on the link's own target, as rsync decides which
// links are "unsafe": an absolute target, or a relative one that climbs out
// of the tree, leads out. A link inside the tree to a file that is itself a
// link out (config.json -> ../../blobs/X, cfg -> config.json) is kept: its
// target is imported in its own right.
func followable(src, root string, res *ImportResult) bool {
	t, err := os.Readlink(src)
	if err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("%s: kept as a symlink: %v", src, err))
		return false
	}
	if !filepath.IsAbs(t) {
		dir, err := filepath.Abs(filepath.Dir(src))
		if err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: kept as a symlink: %v", src, err))
			return false
		}
		t = filepath.Join(dir, t)
		if t == root || strings.HasPrefix(t, root+string(filepath.Separator)) {
			return false // inside the tree: the link is part of it
		}
	}
	info, err := os.Stat(src)
	switch {
	case err != nil:
		res.Notes = append(res.Notes, fmt.Sprintf("%s: kept as a symlink: its target cannot be read (%v)", src, err))
		return false
	case info.IsDir():
		res.Notes = append(res.Notes, fmt.Sprintf("%s: kept as a symlink: it names a directory outside the tree, which is not followed", src))
		return false
	case !info.Mode().IsRegular():
		res.Notes = append(res.Notes, fmt.Sprintf("%s: kept as a symlink: it names a %s", src, info.Mode().Type()))
		return false
	}
	return true
}

// namedInfo is a file's FileInfo under another name (a followed link's).
type namedInfo struct {
	fs.FileInfo
	name string
}

func (n namedInfo) Name() string { return n.name }

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
	err = s.exportEntry(ctx, e, dest, opts, progress, &files, &bytes)
	return files, bytes, err
}

func (s *Store) exportEntry(ctx context.Context, e Entry, dest string, opts ExportOptions, progress func(int64), files *int, bytes *int64) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	switch e.Kind {
	case KindDir:
		if err := os.Mkdir(dest, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("export: %w", err)
		}
		// Never write through a symlink planted where a directory goes
		// (a root export into a shared directory would follow it anywhere).
		if st, err := os.Lstat(dest); err != nil {
			return fmt.Errorf("export: %w", err)
		} else if !st.IsDir() {
			return fmt.Errorf("export %s: exists and is not a directory (symlinks are not followed): %w", dest, fs.ErrExist)
		}
		d, err := s.dirAt(e.ID)
		if err != nil {
			return err
		}
		for _, c := range d.Live() {
			if err := s.exportEntry(ctx, c, filepath.Join(dest, c.Name), opts, progress, files, bytes); err != nil {
				return err
			}
		}
		if e.Mode != 0 {
			// Restored after the entries, so that a read-only directory
			// could still be filled.
			dir, err := os.OpenFile(dest, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			err = restoreMeta(dir, e, dest, opts)
			dir.Close()
			if err != nil {
				return err
			}
		}
	case KindSymlink:
		if opts.Overwrite {
			// Removes a symlink itself, never its target.
			if err := os.Remove(dest); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("export: %w", err)
			}
		}
		if err := os.Symlink(e.Target, dest); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if os.Geteuid() == 0 && e.UID != OwnerUnknown {
			if err := os.Lchown(dest, int(e.UID), int(e.GID)); err != nil {
				return fmt.Errorf("export %s: owner: %w", dest, err)
			}
		}
	case KindFile:
		if !opts.Overwrite {
			if _, err := os.Lstat(dest); err == nil {
				return fmt.Errorf("export %s: %w", dest, fs.ErrExist)
			}
		}
		f, err := s.OpenFile(e.ID)
		if err != nil {
			return fmt.Errorf("export %s: %w", dest, err)
		}
		out, tmp, err := createTemp(dest)
		if err != nil {
			return fmt.Errorf("export: %w", err)
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
			err = os.Rename(tmp, dest)
		}
		if err != nil {
			_ = os.Remove(tmp) // ours: created with O_EXCL under a random name
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
	mode := e.Mode & EntryModeMask
	if os.Geteuid() == 0 {
		if e.UID != OwnerUnknown {
			if err := f.Chown(int(e.UID), int(e.GID)); err != nil {
				return fmt.Errorf("export %s: owner: %w", dest, err)
			}
		}
	} else if mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
		mode &^= fs.ModeSetuid | fs.ModeSetgid
		if opts.Note != nil {
			opts.Note(fmt.Sprintf("%s: setuid/setgid not restored (recorded mode %#o; export is not running as root, so owners are not restored either)", dest, UnixMode(e.Mode)))
		}
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("export %s: mode: %w", dest, err)
	}
	return nil
}

// createTemp creates a new file next to dest under a random name, with
// O_EXCL|O_NOFOLLOW: a symlink planted at any name (predictable or not) is
// never followed, and an existing file is never reused. The file is renamed
// over dest when complete; rename replaces a symlink at dest, it does not
// write through it.
func createTemp(dest string) (*os.File, string, error) {
	dir, base := filepath.Split(dest)
	for range 100 {
		var r [8]byte
		if _, err := rand.Read(r[:]); err != nil {
			return nil, "", err
		}
		tmp := filepath.Join(dir, "."+base+".kylix-"+hex.EncodeToString(r[:]))
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, tmp, err
	}
	return nil, "", fmt.Errorf("create a temporary file next to %s: %w", dest, fs.ErrExist)
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
