package peers

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/kylix/kylix/chunkstore"
)

// Namespaces spread by gossip: every member puts its namespace root in its
// tags (tagNS). A node that sees a member's root it has not merged fetches
// the manifests it lacks over the data plane (each verified against its
// id) and merges that tree into its own, per path (mergeDir).

var emptyDirID = chunkstore.Sum((&chunkstore.DirManifest{}).Encode())

// rootPoll is how often the node checks whether its own namespace moved
// (an import, a write through the mount) to update its tag.
const rootPoll = 200 * time.Millisecond

// nsRetry is how often merges are retried, and members' roots re-checked
// without an event.
const nsRetry = 2 * time.Second

func (n *Node) kickNS() {
	select {
	case n.nsKick <- struct{}{}:
	default:
	}
}

// watchRoot keeps this member's namespace tag equal to its root.
func (n *Node) watchRoot() {
	defer n.wg.Done()
	t := time.NewTicker(rootPoll)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.updateTag()
		}
	}
}

func (n *Node) updateTag() {
	root, _, err := n.s.Root()
	if err != nil {
		return
	}
	n.mu.Lock()
	if root.String() == n.nsTag {
		n.mu.Unlock()
		return
	}
	n.nsTag = root.String()
	n.mu.Unlock()
	n.kickPlace()
	if n.cfg.NoPlacement {
		// No placement pass indexes the stripes the manifests name here.
		if _, recs, err := n.namedChunks(n.ctx); err == nil {
			n.indexStripes(recs)
		}
	}
	if err := n.setTag(tagNS, root.String()); err != nil {
		n.log.Warn("cluster: could not announce the namespace root", "err", err)
	}
}

// setTag sets (value "": removes) one of this member's serf tags, leaving
// the others; one at a time, so that two changes do not undo each other.
func (n *Node) setTag(key, value string) error {
	n.tagMu.Lock()
	defer n.tagMu.Unlock()
	tags := maps.Clone(n.serf.LocalMember().Tags)
	if tags[key] == value {
		return nil
	}
	if value == "" {
		delete(tags, key)
	} else {
		tags[key] = value
	}
	return n.serf.SetTags(tags)
}

// nsLoop merges members' namespaces when kicked (a member event) and every
// nsRetry.
func (n *Node) nsLoop() {
	defer n.wg.Done()
	t := time.NewTicker(nsRetry)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.nsKick:
		}
		n.watchLeases()
		n.mergeAll()
	}
}

func (n *Node) mergeAll() {
	for _, m := range n.serf.Members() {
		if err := n.mergeMember(n.ctx, m); err != nil {
			n.log.Warn("namespace: merge failed; will retry", "member", m.Name, "root", m.Tags[tagNS], "err", err)
		}
	}
}

// mergeMember merges alive member m's announced namespace root into this
// member's, unless it is this member, not alive, or merged already.
func (n *Node) mergeMember(ctx context.Context, m serf.Member) error {
	if m.Name == n.self || m.Status != serf.StatusAlive {
		return nil
	}
	tag := m.Tags[tagNS]
	remote, err := chunkstore.ParseID(tag)
	if err != nil {
		return nil
	}
	n.mu.Lock()
	done := n.nsMerged[m.Name] == tag || n.nsTag == tag
	n.mu.Unlock()
	if done {
		return nil
	}
	p := peer{name: m.Name, addr: dataAddr(m)}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	changed, err := n.mergeFrom(ctx, p, remote)
	cancel()
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.nsMerged[m.Name] = tag
	n.mu.Unlock()
	if changed {
		n.log.Info("namespace: merged", "member", m.Name, "root", tag)
		n.updateTag()
		if n.onNS != nil {
			n.onNS()
		}
	}
	return nil
}

// mergeBeforeGC is the store's hook before a GC marks (chunkstore's
// SetBeforeGC): every alive member's announced namespace is merged here
// first, so that a file another member made from chunks this one no
// longer names (a rename or copy there, a removal here) keeps them. A
// member that cannot be merged stops the GC: collecting without its
// namespace could remove chunks its files still use
// (docs/design/gc.md, "Leases").
func (n *Node) mergeBeforeGC(ctx context.Context) error {
	for _, m := range n.serf.Members() {
		if err := n.mergeMember(ctx, m); err != nil {
			return fmt.Errorf("the namespace of member %s is not merged here yet (%w): a gc now could remove chunks its files use; run it again once the member answers", m.Name, err)
		}
	}
	return nil
}

// mergeFrom fetches the tree at remote from p and merges it into the local
// namespace. It reports whether the local root moved.
func (n *Node) mergeFrom(ctx context.Context, p peer, remote chunkstore.ID) (bool, error) {
	fetched := map[chunkstore.ID][]byte{}
	if err := n.fetchTree(ctx, p, remote, chunkstore.KindDir, fetched); err != nil {
		return false, err
	}
	get := func(id chunkstore.ID) (*chunkstore.DirManifest, error) {
		if id == emptyDirID {
			return &chunkstore.DirManifest{}, nil
		}
		if b, ok := fetched[id]; ok {
			return chunkstore.DecodeDirManifest(b)
		}
		return n.s.DirManifest(id)
	}
	file := func(id chunkstore.ID) (*chunkstore.FileManifest, error) {
		if b, ok := fetched[id]; ok {
			return chunkstore.DecodeFileManifest(b)
		}
		return n.s.FileManifest(id)
	}
	sameBytes := func(a, b chunkstore.ID) bool {
		ma, err := file(a)
		if err != nil {
			return false
		}
		mb, err := file(b)
		return err == nil && ma.Size == mb.Size && slices.Equal(ma.Chunks, mb.Chunks)
	}
	changed := false
	err := n.s.MergeNamespace(func(local chunkstore.ID) (chunkstore.ID, [][]byte, error) {
		if local == remote {
			return local, nil, nil
		}
		var objs [][]byte
		id, err := mergeTrees(local, remote, get, sameBytes, &objs)
		if err != nil || id == local {
			return local, nil, err
		}
		for _, b := range fetched {
			objs = append(objs, b)
		}
		changed = true
		return id, objs, nil
	})
	return changed, err
}

// fetchTree fetches, from p, the manifests of the tree at id that are not
// stored here, into fetched. A directory stored here is complete (its
// subtree was stored with it), so it is not walked.
func (n *Node) fetchTree(ctx context.Context, p peer, id chunkstore.ID, kind chunkstore.Kind, fetched map[chunkstore.ID][]byte) error {
	if id == emptyDirID {
		return nil
	}
	if _, ok := fetched[id]; ok {
		return nil
	}
	if _, err := n.s.GetObject(id); err == nil {
		return nil
	}
	b, err := n.request(ctx, p, request{op: opObject, id: id}, maxObject)
	if err != nil {
		return fmt.Errorf("manifest %s from %s: %w", id.Short(), p.name, err)
	}
	if b == nil {
		return fmt.Errorf("manifest %s: member %s does not have it", id.Short(), p.name)
	}
	if chunkstore.Sum(b) != id {
		n.statsFor(p.name).BadChunks.Add(1)
		return fmt.Errorf("manifest %s from %s fails its hash", id.Short(), p.name)
	}
	if kind == chunkstore.KindFile {
		if _, err := chunkstore.DecodeFileManifest(b); err != nil {
			return fmt.Errorf("manifest %s from %s: %w", id.Short(), p.name, err)
		}
		fetched[id] = b
		return nil
	}
	d, err := chunkstore.DecodeDirManifest(b)
	if err != nil {
		return fmt.Errorf("manifest %s from %s: %w", id.Short(), p.name, err)
	}
	fetched[id] = b
	for _, e := range d.Entries {
		n.s.Clock().Observe(e.HLC)
		if e.Deleted || (e.Kind != chunkstore.KindFile && e.Kind != chunkstore.KindDir) {
			continue // symlinks and special files name no object
		}
		if err := n.fetchTree(ctx, p, e.ID, e.Kind, fetched); err != nil {
			return err
		}
	}
	return nil
}

// mergeTrees merges the directory trees a and b and returns the merged
// tree's id; new directory manifests are appended to objs. The merge is
// per name, the same whichever side is a and which b, and merging a tree
// with a merge it took part in changes nothing:
//
//   - a name on one side only is kept (a tombstone too: it keeps a removal
//     from being undone by a member that has not seen it);
//   - two live directories are merged recursively;
//   - otherwise the entry with the larger HLC wins (ties: by content); when
//     both are live files or symlinks with different content, the loser is
//     kept beside the winner as NAME.conflict-HLC (its own HLC, in hex).
//     Two file manifests with the same chunks are the same content (a
//     file made cold or warm: its manifest names stripes, or no longer):
//     sameBytes says so, and no conflict copy is kept.
func mergeTrees(a, b chunkstore.ID, get func(chunkstore.ID) (*chunkstore.DirManifest, error), sameBytes func(a, b chunkstore.ID) bool, objs *[][]byte) (chunkstore.ID, error) {
	if a == b {
		return a, nil
	}
	da, err := get(a)
	if err != nil {
		return chunkstore.ID{}, err
	}
	db, err := get(b)
	if err != nil {
		return chunkstore.ID{}, err
	}
	out := &chunkstore.DirManifest{}
	var conflicts []chunkstore.Entry
	i, j := 0, 0
	for i < len(da.Entries) || j < len(db.Entries) {
		var ea, eb *chunkstore.Entry
		switch {
		case j >= len(db.Entries) || (i < len(da.Entries) && da.Entries[i].Name < db.Entries[j].Name):
			ea = &da.Entries[i]
			i++
		case i >= len(da.Entries) || db.Entries[j].Name < da.Entries[i].Name:
			eb = &db.Entries[j]
			j++
		default:
			ea, eb = &da.Entries[i], &db.Entries[j]
			i++
			j++
		}
		switch {
		case ea == nil:
			out.Entries = append(out.Entries, *eb)
		case eb == nil:
			out.Entries = append(out.Entries, *ea)
		case *ea == *eb:
			out.Entries = append(out.Entries, *ea)
		case ea.Kind == chunkstore.KindDir && eb.Kind == chunkstore.KindDir && !ea.Deleted && !eb.Deleted:
			w := winner(*ea, *eb)
			id, err := mergeTrees(ea.ID, eb.ID, get, sameBytes, objs)
			if err != nil {
				return chunkstore.ID{}, err
			}
			w.ID = id
			out.Entries = append(out.Entries, w)
		default:
			w := winner(*ea, *eb)
			out.Entries = append(out.Entries, w)
			l := *ea
			if w == *ea {
				l = *eb
			}
			differ := w.ID != l.ID || w.Target != l.Target || w.Kind != l.Kind || w.Rdev != l.Rdev
			if differ && w.Kind == chunkstore.KindFile && l.Kind == chunkstore.KindFile && w.ID != l.ID && sameBytes != nil && sameBytes(w.ID, l.ID) {
				differ = false
			}
			if !w.Deleted && !l.Deleted && w.Kind != chunkstore.KindDir && l.Kind != chunkstore.KindDir && differ {
				l.Name = fmt.Sprintf("%s.conflict-%x", l.Name, uint64(l.HLC))
				if len(l.Name) <= chunkstore.MaxNameLen {
					conflicts = append(conflicts, l)
				}
			}
		}
	}
	for _, c := range conflicts {
		if _, ok := out.Find(c.Name); !ok {
			out.Put(c)
		}
	}
	enc := out.Encode()
	id := chunkstore.Sum(enc)
	if id != a && id != b && id != emptyDirID {
		*objs = append(*objs, enc)
	}
	return id, nil
}

// winner returns the entry that wins a conflict: the larger HLC, then a
// tombstone, then the larger content id and target, then the larger of
// the other fields, so both sides agree whichever entry is theirs.
func winner(a, b chunkstore.Entry) chunkstore.Entry {
	switch {
	case a.HLC != b.HLC:
		if a.HLC > b.HLC {
			return a
		}
		return b
	case a.Deleted != b.Deleted:
		if a.Deleted {
			return a
		}
		return b
	}
	if c := bytes.Compare(a.ID[:], b.ID[:]); c != 0 {
		if c > 0 {
			return a
		}
		return b
	}
	if a.Target != b.Target {
		if a.Target > b.Target {
			return a
		}
		return b
	}
	// Same HLC, content and target, other metadata (a chmod, chown or
	// touch on two members in the same HLC tick): every field decides in
	// turn, so both sides keep the same entry.
	if c := cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Mode, b.Mode), cmp.Compare(a.UID, b.UID),
		cmp.Compare(a.GID, b.GID), cmp.Compare(a.Size, b.Size), cmp.Compare(a.MTime, b.MTime), cmp.Compare(a.Rdev, b.Rdev), strings.Compare(a.Name, b.Name)); c < 0 {
		return b
	}
	return a
}
