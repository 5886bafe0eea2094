package chunkstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"
)

// NamespaceHead is the head holding the root of the namespace tree that
// import writes and the mount shows.
const NamespaceHead = "namespace"

var emptyDir = (&DirManifest{}).Encode()

// Root returns the namespace's root directory manifest ID and the HLC of its
// last update (zero for a store never written).
func (s *Store) Root() (ID, HLC, error) {
	// Every lookup through the mount starts here: the head is read from
	// the index once per commit, not in a read transaction per lookup
	// (which was half of the node's time in a first listing). The count
	// is read before the head and moves after each commit has returned,
	// so a cached head is never older than its count says.
	n := s.commits.Load()
	if c := s.root.Load(); c != nil && c.commits == n {
		return c.id, c.hlc, nil
	}
	h, err := s.GetHead(NamespaceHead)
	if errors.Is(err, ErrNotFound) {
		h, err = Head{Root: Sum(emptyDir)}, nil
	}
	if err != nil {
		return ID{}, 0, err
	}
	s.root.Store(&cachedRoot{commits: n, id: h.Root, hlc: h.HLC})
	return h.Root, h.HLC, nil
}

// cachedRoot is the namespace head as read after commits commits.
type cachedRoot struct {
	commits uint64
	id      ID
	hlc     HLC
}

func (s *Store) dirAt(id ID) (*DirManifest, error) {
	if id == Sum(emptyDir) {
		return &DirManifest{}, nil
	}
	return s.DirManifest(id)
}

// rootEntry is the synthetic entry of the namespace root.
func rootEntry(id ID, h HLC) Entry {
	return Entry{Kind: KindDir, Mode: 0o755 | fs.ModeDir, UID: OwnerUnknown, GID: OwnerUnknown, ID: id, HLC: h, MTime: h.Wall().UnixNano()}
}

// Lookup returns the entry at a namespace path ("" is the root).
func (s *Store) Lookup(path string) (Entry, error) {
	parts, err := SplitPath(path)
	if err != nil {
		return Entry{}, err
	}
	root, h, err := s.Root()
	if err != nil {
		return Entry{}, err
	}
	e := rootEntry(root, h)
	var rootM *DirManifest
	for i, name := range parts {
		if e.Kind != KindDir {
			return Entry{}, &PathError{Op: "lookup", Path: strings.Join(parts[:i], "/"), Err: ErrNotDir}
		}
		d, err := s.dirAt(e.ID)
		if err != nil {
			return Entry{}, fmt.Errorf("lookup %s: %w", path, err)
		}
		if i == 0 {
			rootM = d
		}
		j, ok := d.Find(name)
		if !ok || d.Entries[j].Deleted || (i == 0 && ReservedRoot(name)) {
			return Entry{}, &PathError{Op: "lookup", Path: path, Err: ErrNotFound}
		}
		e = d.Entries[j]
	}
	if e.Kind == KindHardlink {
		t, err := s.tableOf(rootM)
		if err != nil {
			return Entry{}, fmt.Errorf("lookup %s: %w", path, err)
		}
		return resolveLink(e, t)
	}
	return e, nil
}

// List returns the live entries of the directory at path, sorted by name.
func (s *Store) List(path string) ([]Entry, error) {
	e, err := s.Lookup(path)
	if err != nil {
		return nil, err
	}
	if e.Kind != KindDir {
		return nil, &PathError{Op: "list", Path: path, Err: ErrNotDir}
	}
	d, err := s.dirAt(e.ID)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	clean, _ := CleanPath(path)
	var table *DirManifest
	return s.liveEntries(clean, d, &table)
}

// Walk calls fn for every live entry below path (depth first, in name order),
// with the entry's namespace path. Directory manifests shared by several paths
// are read once per path.
func (s *Store) Walk(path string, fn func(p string, e Entry) error) error {
	e, err := s.Lookup(path)
	if err != nil {
		return err
	}
	clean, _ := CleanPath(path)
	return s.walk(clean, e, fn)
}

// walk is Walk from entry e at p: hard-link names are given as their link
// set's entry (with Link and Nlink), the link table is not walked.
func (s *Store) walk(p string, e Entry, fn func(string, Entry) error) error {
	var table *DirManifest
	return s.walkIn(p, e, fn, &table)
}

func (s *Store) walkIn(p string, e Entry, fn func(string, Entry) error, table **DirManifest) error {
	if err := fn(p, e); err != nil {
		return err
	}
	if e.Kind != KindDir {
		return nil
	}
	d, err := s.dirAt(e.ID)
	if err != nil {
		return fmt.Errorf("walk %s: %w", p, err)
	}
	live, err := s.liveEntries(p, d, table)
	if err != nil {
		return fmt.Errorf("walk %s: %w", p, err)
	}
	for _, c := range live {
		if err := s.walkIn(joinPath(p, c.Name), c, fn, table); err != nil {
			return err
		}
	}
	return nil
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// NSTx is a namespace transaction: changes are made to an in-memory copy of
// the touched directories and written at Commit as new directory manifests and
// one head update, atomically. Create one with Store.Update.
type NSTx struct {
	s    *Store
	hlc  HLC
	root *txDir
	objs [][]byte
	// links: change of each link set's number of names; recount: a
	// directory went (it may have held names), so every set is counted
	// again at the end (links.go). moving: a Rename is moving a
	// directory, whose names stay.
	links   map[uint64]int
	recount bool
	moving  bool
	wall    int64 // time.Now at the start, in nanoseconds (ctime)
}

type txDir struct {
	m        *DirManifest
	children map[string]*txDir // loaded subdirectories
	dirty    bool
}

// Update runs fn in a namespace transaction and commits it if fn returns nil.
// Transactions are serialised; each gets one HLC stamped on every entry it
// changes.
func (s *Store) Update(fn func(tx *NSTx) error) error {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	return s.updateLocked(fn)
}

func (s *Store) updateLocked(fn func(tx *NSTx) error) error {
	root, _, err := s.Root()
	if err != nil {
		return err
	}
	rm, err := s.dirAt(root)
	if err != nil {
		return fmt.Errorf("namespace root: %w", err)
	}
	tx := &NSTx{s: s, hlc: s.clock.Now(), root: &txDir{m: rm}, wall: time.Now().UnixNano()}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.finishLinks(); err != nil {
		return err
	}
	if !tx.root.dirty {
		return nil
	}
	newRoot := tx.flush(tx.root)
	return s.commitObjects(tx.objs, &Head{Name: NamespaceHead, Root: newRoot, HLC: tx.hlc})
}

// HLC returns the transaction's timestamp.
func (tx *NSTx) HLC() HLC { return tx.hlc }

// flush encodes dirty directories bottom-up and returns d's new ID.
func (tx *NSTx) flush(d *txDir) ID {
	for name, c := range d.children {
		if !c.dirty {
			continue
		}
		id := tx.flush(c)
		i, ok := d.m.Find(name)
		if ok {
			d.m.Entries[i].ID = id
			d.m.Entries[i].HLC = tx.hlc
		}
	}
	obj := d.m.Encode()
	tx.objs = append(tx.objs, obj)
	return Sum(obj)
}

// commitObjects stores objects and optionally moves a head, in one commit
// (one metadata-log frame, then one index transaction).
func (s *Store) commitObjects(objs [][]byte, head *Head) error {
	recs := make([]record, 0, len(objs)+1)
	for _, o := range objs {
		recs = append(recs, record{kind: recObject, obj: o, id: Sum(o)})
	}
	if head != nil {
		recs = append(recs, record{kind: recHead, head: *head})
	}
	if err := s.commit(recs); err != nil {
		return fmt.Errorf("commit namespace: %w", err)
	}
	return nil
}

// dir walks to the directory at parts, loading it. With create, missing
// directories are made (mode 0755, owned by this process's user, who asked
// for them) and everything on the way is marked dirty.
func (tx *NSTx) dir(parts []string, create, markDirty bool) (*txDir, error) {
	d := tx.root
	if markDirty {
		d.dirty = true
	}
	for i, name := range parts {
		if c, ok := d.children[name]; ok {
			d = c
			if markDirty {
				d.dirty = true
			}
			continue
		}
		j, ok := d.m.Find(name)
		var child *txDir
		switch {
		case ok && !d.m.Entries[j].Deleted && d.m.Entries[j].Kind == KindDir:
			m, err := tx.s.dirAt(d.m.Entries[j].ID)
			if err != nil {
				return nil, err
			}
			child = &txDir{m: m}
		case ok && !d.m.Entries[j].Deleted:
			return nil, &PathError{Op: "lookup", Path: strings.Join(parts[:i+1], "/"), Err: ErrNotDir}
		case !create:
			return nil, &PathError{Op: "lookup", Path: strings.Join(parts[:i+1], "/"), Err: ErrNotFound}
		default:
			child = &txDir{m: &DirManifest{}}
			d.m.Put(Entry{Name: name, Kind: KindDir, Mode: 0o755, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), MTime: tx.hlc.Wall().UnixNano(), ID: Sum(emptyDir), HLC: tx.hlc})
			d.dirty = true
		}
		if d.children == nil {
			d.children = map[string]*txDir{}
		}
		d.children[name] = child
		d = child
		if markDirty {
			d.dirty = true
		}
	}
	return d, nil
}

// Lookup returns the entry at path as this transaction sees it.
func (tx *NSTx) Lookup(path string) (Entry, error) {
	parts, err := SplitPath(path)
	if err != nil {
		return Entry{}, err
	}
	if len(parts) == 0 {
		return Entry{Kind: KindDir, Mode: 0o755, UID: OwnerUnknown, GID: OwnerUnknown}, nil
	}
	if ReservedRoot(parts[0]) {
		return Entry{}, &PathError{Op: "lookup", Path: path, Err: ErrNotFound}
	}
	d, i, ok, err := tx.rawLookup(parts)
	if err != nil {
		return Entry{}, err
	}
	if !ok {
		return Entry{}, &PathError{Op: "lookup", Path: path, Err: ErrNotFound}
	}
	return tx.resolve(d.m.Entries[i])
}

// List returns the live entries of the directory at path.
func (tx *NSTx) List(path string) ([]Entry, error) {
	parts, err := SplitPath(path)
	if err != nil {
		return nil, err
	}
	if len(parts) > 0 && ReservedRoot(parts[0]) {
		return nil, &PathError{Op: "list", Path: path, Err: ErrNotFound}
	}
	d, err := tx.dir(parts, false, false)
	if err != nil {
		return nil, err
	}
	out := d.m.Live()
	if len(parts) == 0 {
		out = slices.DeleteFunc(out, func(e Entry) bool { return ReservedRoot(e.Name) })
	}
	for i, e := range out {
		if out[i], err = tx.resolve(e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Put sets the entry at path (its Name is taken from the path), creating
// missing parent directories. An existing entry is replaced, a directory
// included (the whole subtree is replaced). The entry's HLC is the
// transaction's.
func (tx *NSTx) Put(path string, e Entry) error {
	parts, err := SplitPath(path)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return fmt.Errorf("put: the namespace root cannot be replaced: %w", ErrInvalidPath)
	}
	if ReservedRoot(parts[0]) {
		return fmt.Errorf("put %s: the name %s is reserved in the namespace root: %w", path, parts[0], ErrInvalidPath)
	}
	if e.Kind == KindHardlink {
		return tx.putName(parts, e.Link)
	}
	if e.Link != 0 {
		// An entry of a link set: its content and metadata are the
		// set's, and path becomes (or stays) one of its names.
		if err := tx.putLinked(e.Link, e); err != nil {
			return fmt.Errorf("put %s: %w", path, err)
		}
		if d, i, ok, err := tx.rawLookup(parts); err == nil && ok && d.m.Entries[i].Kind == KindHardlink && d.m.Entries[i].Link == e.Link {
			return nil
		}
		return tx.putName(parts, e.Link)
	}
	switch {
	case e.Kind == KindFile, e.Kind == KindDir, e.Kind == KindSymlink:
	case e.Kind.Special():
		// Only metadata: no content, no size, a number for devices.
		e.ID, e.Size, e.Target = ID{}, 0, ""
		if !e.Kind.IsDevice() {
			e.Rdev = 0
		}
	default:
		return fmt.Errorf("put %s: kind %v: %w", path, e.Kind, ErrInvalidPath)
	}
	d, err := tx.dir(parts[:len(parts)-1], true, true)
	if err != nil {
		return fmt.Errorf("put %s: %w", path, err)
	}
	name := parts[len(parts)-1]
	if err := tx.dropOld(d, name); err != nil {
		return err
	}
	e.Name, e.HLC, e.Deleted, e.Nlink = name, tx.hlc, false, 0
	e.Mode &= EntryModeMask
	if e.Kind == KindSymlink {
		e.Size = int64(len(e.Target))
	}
	d.m.Put(e)
	delete(d.children, name)
	return nil
}

// Remove deletes the entry at path, leaving a tombstone. A directory must be
// empty unless recursive is set.
func (tx *NSTx) Remove(path string, recursive bool) error {
	parts, err := SplitPath(path)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return fmt.Errorf("remove: the namespace root cannot be removed: %w", ErrInvalidPath)
	}
	if ReservedRoot(parts[0]) {
		return &PathError{Op: "remove", Path: path, Err: ErrNotFound}
	}
	return tx.remove(parts, recursive, path)
}

// remove is Remove of parts, reserved names included.
func (tx *NSTx) remove(parts []string, recursive bool, path string) error {
	d, err := tx.dir(parts[:len(parts)-1], false, false)
	if err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	name := parts[len(parts)-1]
	i, ok := d.m.Find(name)
	if !ok || d.m.Entries[i].Deleted {
		return &PathError{Op: "remove", Path: path, Err: ErrNotFound}
	}
	if d.m.Entries[i].Kind == KindDir && !recursive {
		sub, err := tx.dir(parts, false, false)
		if err != nil {
			return err
		}
		if len(sub.m.Live()) > 0 {
			return &PathError{Op: "remove", Path: path, Err: ErrNotEmpty}
		}
	}
	if _, err := tx.dir(parts[:len(parts)-1], false, true); err != nil {
		return err
	}
	if err := tx.dropOld(d, name); err != nil {
		return err
	}
	d.m.Entries[i] = Entry{Name: name, Kind: d.m.Entries[i].Kind, HLC: tx.hlc, Deleted: true, ID: Sum(emptyDir)}
	if d.m.Entries[i].Kind == KindHardlink {
		d.m.Entries[i].Link = 1 // a tombstone's set number means nothing, but 0 is not encodable
	}
	if d.m.Entries[i].Kind == KindSymlink {
		d.m.Entries[i].Target = "-"
	}
	delete(d.children, name)
	return nil
}

// Rename moves the entry at from to to, replacing what is at to (a
// non-empty directory at to is an error).
func (tx *NSTx) Rename(from, to string) error {
	e, err := tx.Lookup(from)
	if err != nil {
		return err
	}
	if old, err := tx.Lookup(to); err == nil && old.Kind == KindDir {
		if e.Kind != KindDir {
			return &PathError{Op: "rename " + from + " to", Path: to, Err: ErrIsDir}
		}
		if l, err := tx.List(to); err == nil && len(l) > 0 {
			return &PathError{Op: "rename " + from + " to", Path: to, Err: ErrNotEmpty}
		}
	}
	cf, _ := CleanPath(from)
	ct, _ := CleanPath(to)
	if ct == cf || strings.HasPrefix(ct, cf+"/") {
		return fmt.Errorf("rename %s into itself: %w", from, ErrInvalidPath)
	}
	// Make sure a loaded, modified subtree is written before it moves.
	if parts, _ := SplitPath(from); e.Kind == KindDir {
		if d, err := tx.dir(parts, false, false); err == nil && d.dirty {
			e.ID = tx.flush(d)
		}
	}
	e.CTime = tx.now() // rename(2) changes the inode's ctime on ext4
	tx.moving = true
	err = tx.Remove(from, true)
	if err == nil {
		err = tx.Put(to, e)
	}
	tx.moving = false
	return err
}

// PutFile stores the file manifest m (an empty file's, say) for use in Put
// and returns its ID.
func (tx *NSTx) PutFile(m *FileManifest) ID {
	obj := m.Encode()
	tx.objs = append(tx.objs, obj)
	return Sum(obj)
}

// PutDir stores the directory manifest m for use in Put and returns its ID.
func (tx *NSTx) PutDir(m *DirManifest) ID {
	obj := m.Encode()
	tx.objs = append(tx.objs, obj)
	return Sum(obj)
}

// MergeNamespace moves the namespace root for a merge with another node's
// namespace (the peer layer): fn is given the current root and returns the
// new root and the objects it names that are not stored yet. They are
// committed in one step, serialised with Update, under a fresh HLC. When fn
// returns the root it was given, nothing is written.
func (s *Store) MergeNamespace(fn func(root ID) (ID, [][]byte, error)) error {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	root, _, err := s.Root()
	if err != nil {
		return err
	}
	newRoot, objs, err := fn(root)
	if err != nil || newRoot == root {
		return err
	}
	if err := s.commitObjects(objs, &Head{Name: NamespaceHead, Root: newRoot, HLC: s.clock.Now()}); err != nil {
		return err
	}
	// Two members may each have changed a link set's names: count them
	// again (docs/design/hardlinks.md, "Merge").
	return s.updateLocked(func(tx *NSTx) error { return tx.fixLinks() })
}
