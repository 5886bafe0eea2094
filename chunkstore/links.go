package chunkstore

// Hard links (docs/design/hardlinks.md). A link set is one entry in the
// link table, a directory named LinkTable in the namespace root, hidden
// from every listing and lookup: its entries are named by the set's number
// (16 hex digits) and hold what the names share (kind, content, owner,
// mode, mtime) and the number of names (Nlink). Each name is a
// KindHardlink entry holding only the set's number. Lookups return the
// set's entry under the name, with Link and Nlink set. The table is an
// ordinary directory to everything that walks manifests (gc marks its
// files' content, the peers' merge merges it per set, verify reads it),
// so none of them needed a rule of its own.

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// LinkTable is the name of the link table in the namespace root. The name
// is reserved there: Put refuses it and lookups do not see it.
const LinkTable = ".kylix-links"

func linkName(l uint64) string { return fmt.Sprintf("%016x", l) }

// parseLinkName returns the set number of a link-table name, and the
// conflict suffix (".conflict-HLC") a merge may have added.
func parseLinkName(name string) (uint64, string, bool) {
	base, suffix := name, ""
	if i := strings.IndexByte(name, '.'); i >= 0 {
		base, suffix = name[:i], name[i:]
	}
	if len(base) != 16 {
		return 0, "", false
	}
	l, err := strconv.ParseUint(base, 16, 64)
	return l, suffix, err == nil && l != 0
}

// resolveLink returns the entry the KindHardlink name e stands for, from
// the link table (nil: there is none).
func resolveLink(e Entry, table *DirManifest) (Entry, error) {
	if table != nil {
		if i, ok := table.Find(linkName(e.Link)); ok && !table.Entries[i].Deleted {
			t := table.Entries[i]
			t.Name, t.Link, t.HLC = e.Name, e.Link, max(t.HLC, e.HLC)
			return t, nil
		}
	}
	return Entry{}, &PathError{Op: "lookup", Path: e.Name, Err: fmt.Errorf("link set %016x is not in the link table: %w", e.Link, ErrNotFound)}
}

// tableOf returns the link table named in the root manifest root, nil if
// there is none.
func (s *Store) tableOf(root *DirManifest) (*DirManifest, error) {
	return s.reservedOf(root, LinkTable)
}

// reservedOf returns the reserved directory name (ReservedRoot) of the
// root manifest root, nil if there is none.
func (s *Store) reservedOf(root *DirManifest, name string) (*DirManifest, error) {
	i, ok := root.Find(name)
	if !ok || root.Entries[i].Deleted || root.Entries[i].Kind != KindDir {
		return nil, nil
	}
	return s.dirAt(root.Entries[i].ID)
}

// reservedDir returns the current namespace's reserved directory name,
// nil if there is none.
func (s *Store) reservedDir(name string) (*DirManifest, error) {
	root, _, err := s.Root()
	if err != nil {
		return nil, err
	}
	rm, err := s.dirAt(root)
	if err != nil {
		return nil, err
	}
	return s.reservedOf(rm, name)
}

// linkTable returns the current namespace's link table, nil if none.
func (s *Store) linkTable() (*DirManifest, error) { return s.reservedDir(LinkTable) }

// liveEntries returns d's live entries as lookups show them: the link
// table left out of the root (dir ""), hard-link names resolved through
// table (loaded on first need when nil).
func (s *Store) liveEntries(dir string, d *DirManifest, table **DirManifest) ([]Entry, error) {
	out := d.Live()
	if dir == "" {
		out = slices.DeleteFunc(out, func(e Entry) bool { return ReservedRoot(e.Name) })
	}
	for i, e := range out {
		if e.Kind != KindHardlink {
			continue
		}
		if *table == nil {
			t, err := s.linkTable()
			if err != nil {
				return nil, err
			}
			if t == nil {
				t = &DirManifest{}
			}
			*table = t
		}
		r, err := resolveLink(e, *table)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", joinPath(dir, e.Name), err)
		}
		out[i] = r
	}
	return out, nil
}

// ResolveIn returns what entry e of a directory manifest stands for: e
// itself, or for a hard-link name the link set's entry under e's name,
// looked up in table (the link table, nil when there is none).
func ResolveIn(e Entry, table *DirManifest) (Entry, error) {
	if e.Kind != KindHardlink {
		return e, nil
	}
	return resolveLink(e, table)
}

// TableEntry returns the link table entry of root manifest root, false if
// there is none.
func TableEntry(root *DirManifest) (Entry, bool) {
	i, ok := root.Find(LinkTable)
	if !ok || root.Entries[i].Deleted || root.Entries[i].Kind != KindDir {
		return Entry{}, false
	}
	return root.Entries[i], true
}

func newLinkID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("link set number: %w", err)
		}
		if l := binary.LittleEndian.Uint64(b[:]); l != 0 {
			return l, nil
		}
	}
}

// table returns the transaction's link table; with create, it is made
// (root's, 0700: nothing reads it through a path) when missing, and
// marked dirty.
func (tx *NSTx) table(create bool) (*txDir, error) {
	if i, ok := tx.root.m.Find(LinkTable); !ok || tx.root.m.Entries[i].Deleted {
		if !create {
			return nil, nil
		}
		tx.root.m.Put(Entry{Name: LinkTable, Kind: KindDir, Mode: 0o700, UID: 0, GID: 0, ID: Sum(emptyDir), HLC: tx.hlc, MTime: tx.hlc.Wall().UnixNano()})
		tx.root.dirty = true
	}
	return tx.dir([]string{LinkTable}, false, create)
}

// rawLookup returns the stored entry at parts (a hard-link name as it is).
func (tx *NSTx) rawLookup(parts []string) (*txDir, int, bool, error) {
	d, err := tx.dir(parts[:len(parts)-1], false, false)
	if err != nil {
		return nil, 0, false, err
	}
	i, ok := d.m.Find(parts[len(parts)-1])
	return d, i, ok && !d.m.Entries[i].Deleted, nil
}

// resolve returns what the stored entry e stands for, as this transaction
// sees the link table.
func (tx *NSTx) resolve(e Entry) (Entry, error) {
	if e.Kind != KindHardlink {
		return e, nil
	}
	t, err := tx.table(false)
	if err != nil {
		return Entry{}, err
	}
	var m *DirManifest
	if t != nil {
		m = t.m
	}
	return resolveLink(e, m)
}

// Link makes to another name of the file, symlink or special file at from
// (link(2)). A name that is its file's only one first becomes a link set of
// one: its entry moves into the link table and the name becomes a
// KindHardlink. to must not exist. Directories cannot be linked (EPERM in
// the mount).
func (tx *NSTx) Link(from, to string) error {
	fp, err := SplitPath(from)
	if err != nil {
		return err
	}
	tp, err := SplitPath(to)
	if err != nil {
		return err
	}
	if len(fp) == 0 || len(tp) == 0 || ReservedRoot(fp[0]) || ReservedRoot(tp[0]) {
		return fmt.Errorf("link %s to %s: %w", from, to, ErrInvalidPath)
	}
	d, i, ok, err := tx.rawLookup(fp)
	if err != nil {
		return err
	}
	if !ok {
		return &PathError{Op: "link", Path: from, Err: ErrNotFound}
	}
	e := d.m.Entries[i]
	if e.Kind == KindHardlink && e.Link == 0 {
		return fmt.Errorf("link %s: link set 0: %w", from, ErrCorrupt)
	}
	if e.Kind == KindDir {
		return &PathError{Op: "link", Path: from, Err: ErrIsDir}
	}
	if _, err := tx.Lookup(to); err == nil {
		return &PathError{Op: "link", Path: to, Err: ErrExists}
	}
	l := e.Link
	if e.Kind != KindHardlink {
		t, err := tx.table(true)
		if err != nil {
			return err
		}
		for {
			if l, err = newLinkID(); err != nil {
				return err
			}
			if _, taken := t.m.Find(linkName(l)); !taken {
				break
			}
		}
		te := e
		te.Name, te.Link, te.Nlink, te.HLC = linkName(l), 0, 1, tx.hlc
		t.m.Put(te)
		// Making the table may have moved entries of the root: find
		// the name again.
		if d, err = tx.dir(fp[:len(fp)-1], false, true); err != nil {
			return err
		}
		d.m.Put(Entry{Name: e.Name, Kind: KindHardlink, Link: l, HLC: tx.hlc})
	}
	return tx.putName(tp, l)
}

// LinkSet makes to another name of link set l (a link(2) through a node
// of the set whose own name is gone). to must not exist.
func (tx *NSTx) LinkSet(l uint64, to string) error {
	tp, err := SplitPath(to)
	if err != nil {
		return err
	}
	if len(tp) == 0 || ReservedRoot(tp[0]) {
		return fmt.Errorf("link to %s: %w", to, ErrInvalidPath)
	}
	if _, err := tx.Lookup(to); err == nil {
		return &PathError{Op: "link", Path: to, Err: ErrExists}
	}
	if _, err := tx.resolve(Entry{Kind: KindHardlink, Link: l}); err != nil {
		return err
	}
	return tx.putName(tp, l)
}

// putName makes parts a name of link set l (replacing what is there).
func (tx *NSTx) putName(parts []string, l uint64) error {
	d, err := tx.dir(parts[:len(parts)-1], true, true)
	if err != nil {
		return err
	}
	name := parts[len(parts)-1]
	if err := tx.dropOld(d, name); err != nil {
		return err
	}
	d.m.Put(Entry{Name: name, Kind: KindHardlink, Link: l, HLC: tx.hlc})
	delete(d.children, name)
	tx.delta(l, 1)
	return nil
}

// now is the transaction's wall time, the change time it records.
func (tx *NSTx) now() int64 { return tx.wall }

// Now is the change time (Unix nanoseconds) the transaction records on
// what it links, unlinks and renames, for a caller that shows it.
func (tx *NSTx) Now() int64 { return tx.wall }

// dropOld accounts for the live entry at name in d going away or being
// replaced: one name fewer for a link set, a recount for a directory
// (which may hold names of link sets).
func (tx *NSTx) dropOld(d *txDir, name string) error {
	i, ok := d.m.Find(name)
	if !ok || d.m.Entries[i].Deleted {
		return nil
	}
	switch old := d.m.Entries[i]; old.Kind {
	case KindHardlink:
		tx.delta(old.Link, -1)
	case KindDir:
		if tx.moving || tx.recount {
			break
		}
		empty := old.ID == Sum(emptyDir)
		if c, ok := d.children[name]; ok {
			empty = len(c.m.Live()) == 0
		}
		if !empty {
			tx.recount = true
		}
	}
	return nil
}

func (tx *NSTx) delta(l uint64, n int) {
	if tx.links == nil {
		tx.links = map[uint64]int{}
	}
	tx.links[l] += n
}

// putLinked writes e's content and metadata into link set l's entry (a
// write, chmod, chown or utimes of a file with several names): every name
// sees it. Its link count stays.
func (tx *NSTx) putLinked(l uint64, e Entry) error {
	t, err := tx.table(false)
	if err != nil {
		return err
	}
	if t == nil {
		return fmt.Errorf("link set %016x: no link table: %w", l, ErrNotFound)
	}
	i, ok := t.m.Find(linkName(l))
	if !ok || t.m.Entries[i].Deleted {
		return fmt.Errorf("link set %016x: %w", l, ErrNotFound)
	}
	if _, err := tx.table(true); err != nil { // mark dirty
		return err
	}
	old := t.m.Entries[i]
	e.Name, e.Link, e.Nlink, e.HLC, e.Deleted = old.Name, 0, old.Nlink, tx.hlc, false
	if e.Kind == 0 {
		e.Kind = old.Kind
	}
	e.Mode &= EntryModeMask
	t.m.Entries[i] = e
	return nil
}

// LookupLinked returns link set l's entry (a node of the set whose own
// name is gone needs it to change its metadata).
func (tx *NSTx) LookupLinked(l uint64) (Entry, error) {
	return tx.resolve(Entry{Kind: KindHardlink, Link: l})
}

// PutLinked is putLinked for callers that hold a node of the link set
// whose own name may be gone (the mount's committer): the set is found by
// its number, not by a path.
func (tx *NSTx) PutLinked(l uint64, e Entry) error { return tx.putLinked(l, e) }

// finishLinks applies the transaction's link-count changes to the link
// table before it is written: a set whose last name went is dropped from
// the table. After a directory was replaced or removed (it may have held
// names of sets), every set is counted again instead.
func (tx *NSTx) finishLinks() error {
	if tx.recount {
		t, err := tx.table(false)
		if err != nil || t == nil {
			return err
		}
		return tx.fixLinks()
	}
	if len(tx.links) == 0 {
		return nil
	}
	t, err := tx.table(true)
	if err != nil {
		return err
	}
	for l, n := range tx.links {
		if n == 0 {
			continue
		}
		i, ok := t.m.Find(linkName(l))
		if !ok {
			continue // counted again by fixLinks on the next merge
		}
		c := int(t.m.Entries[i].Nlink) + n
		if c <= 0 {
			t.m.Entries = slices.Delete(t.m.Entries, i, i+1)
			continue
		}
		// A link count changed: the inode's change time, as link(2)
		// and unlink(2) set it on ext4.
		t.m.Entries[i].Nlink, t.m.Entries[i].HLC, t.m.Entries[i].CTime = uint32(c), tx.hlc, tx.now()
	}
	return nil
}

// FixLinks counts the names of every link set in the namespace and makes
// the link table agree (docs/design/hardlinks.md, "Merge"): a set's Nlink
// becomes its number of names, a set without names is dropped, and a
// conflict version a merge kept of a set (SET.conflict-HLC in the table)
// becomes an ordinary file beside the set's first name (in walk order),
// NAME.conflict-HLC, as a conflict of an ordinary file is kept. The peers'
// merge runs it after each merge that brought a link table.
func (tx *NSTx) FixLinks() error { return tx.fixLinks() }

func (tx *NSTx) fixLinks() error {
	t, err := tx.table(false)
	if err != nil || t == nil {
		return err
	}
	count := map[uint64]uint32{}
	first := map[uint64][]string{}
	var walk func(parts []string, d *txDir) error
	walk = func(parts []string, d *txDir) error {
		for _, e := range d.m.Entries {
			if e.Deleted || (len(parts) == 0 && e.Name == LinkTable) {
				continue
			}
			switch e.Kind {
			case KindHardlink:
				if count[e.Link] == 0 {
					first[e.Link] = append(slices.Clip(parts), e.Name)
				}
				count[e.Link]++
			case KindDir:
				p := append(slices.Clip(parts), e.Name)
				c, err := tx.dir(p, false, false)
				if err != nil {
					return err
				}
				if err := walk(p, c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(nil, tx.root); err != nil {
		return err
	}
	changed := false
	var copies []Entry
	var copyAt [][]string
	kept := t.m.Entries[:0:0]
	for _, e := range t.m.Entries {
		l, suffix, ok := parseLinkName(e.Name)
		switch {
		case !ok || e.Deleted:
			changed = true // not a set: dropped
		case suffix != "":
			changed = true
			if count[l] > 0 && !e.Deleted {
				copies = append(copies, e)
				copyAt = append(copyAt, first[l])
			}
		case count[l] == 0:
			changed = true
		default:
			if e.Nlink != count[l] {
				e.Nlink, e.HLC = count[l], tx.hlc
				changed = true
			}
			kept = append(kept, e)
		}
	}
	if !changed {
		return nil
	}
	if _, err := tx.table(true); err != nil {
		return err
	}
	t.m.Entries = kept
	for i, c := range copies {
		p := copyAt[i]
		_, suffix, _ := parseLinkName(c.Name)
		name := p[len(p)-1] + suffix
		if len(name) > MaxNameLen {
			continue
		}
		cp := append(slices.Clip(p[:len(p)-1]), name)
		if _, err := tx.Lookup(strings.Join(cp, "/")); err == nil {
			continue
		}
		c.Link, c.Nlink = 0, 0
		if err := tx.Put(strings.Join(cp, "/"), c); err != nil {
			return err
		}
	}
	return nil
}
