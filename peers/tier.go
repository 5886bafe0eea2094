package peers

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers/stripe"
)

// Tiers (docs/design/erasure.md, "Tiers"): MakeCold codes the files below
// a path into stripes and names them in the files' manifests; MakeWarm
// gives their chunks back to replicas. Both run on one member, block until
// done and report progress; placement on every member then keeps each
// shard at its home (homes) and drops the copies beyond it.

// TierResult is what MakeCold or MakeWarm did.
type TierResult struct {
	Files int `json:"files"` // files whose manifests changed
	// Changed: files written, replaced or removed during the conversion,
	// left as they were (run it again); Pinned: files below a pinned
	// path, which never move.
	Changed []string `json:"changed,omitempty"`
	Pinned  []string `json:"pinned,omitempty"`
	// Stripes and Chunks coded by this run, their bytes (Logical) and the
	// parity stored for them.
	Stripes int    `json:"stripes"`
	Chunks  int    `json:"chunks"`
	Logical int64  `json:"logical_bytes"`
	Parity  int64  `json:"parity_bytes"`
	Shape   string `json:"shape,omitempty"` // k+m of the stripes coded
	// Pushed: replicas stored on their owners by MakeWarm.
	Pushed      int   `json:"pushed_chunks"`
	PushedBytes int64 `json:"pushed_bytes"`
}

// TierProgress is called as a conversion goes: bytes done of total.
type TierProgress func(done, total int64)

// tierFile is one file of a conversion.
type tierFile struct {
	path    string
	id      chunkstore.ID
	m       *chunkstore.FileManifest
	changed time.Time // the entry's last change in the namespace (its HLC)
}

// tierFiles lists the files at and below p (each version once), without
// those under a pinned path, which it returns apart.
func (n *Node) tierFiles(ctx context.Context, p string) (files []tierFile, pinned []string, err error) {
	pfs, err := n.s.FilesBelow(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	var pins []string
	if n.cfg.Keep != nil {
		if pins, err = n.cfg.Keep(); err != nil {
			return nil, nil, fmt.Errorf("reading the pinned paths: %w", err)
		}
	}
	for _, pf := range pfs {
		if pf.Again {
			continue
		}
		if slices.ContainsFunc(pins, func(pin string) bool { return below(pf.Path, pin) }) {
			pinned = append(pinned, pf.Path)
			continue
		}
		m, err := n.s.FileManifest(pf.Entry.ID)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", pf.Path, err)
		}
		files = append(files, tierFile{path: pf.Path, id: pf.Entry.ID, m: m, changed: pf.Entry.HLC.Wall()})
	}
	return files, pinned, nil
}

// lastRead answers opLastRead from this member's store: per file version,
// the Unix day its last read here counts until (0: never read here).
func (sv *server) lastRead(raw []byte) []byte {
	out := make([]byte, len(raw)/32*4)
	for i := range len(raw) / 32 {
		if t, ok := sv.s.LastRead(chunkstore.ID(raw[32*i : 32*i+32])); ok {
			binary.BigEndian.PutUint32(out[4*i:], uint32(t.Unix()/86400))
		}
	}
	return out
}

// below reports whether namespace path p is dir or below it.
func below(p, dir string) bool {
	p, dir = path.Clean("/"+p), path.Clean("/"+dir)
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// MakeCold codes the chunks of the files at and below p that are not
// coded yet into stripes of the cluster's shape (StripeShape; a cluster
// too small says so: *ClusterTooSmallError), stores every shard on its
// holder, then names the stripes in the files' manifests in one namespace
// update. A crash before that update changes nothing (the parity stored
// is named by nothing: garbage collection takes it); after it the files
// are cold, and placement drops the copies beyond each shard's home once
// that home confirms it. Files under a pinned path are left warm.
func (n *Node) MakeCold(ctx context.Context, p string, progress TierProgress) (TierResult, error) {
	return n.MakeColdK(ctx, p, 0, progress)
}

// MakeColdK is MakeCold with stripes of k data shards (StripeShapeK; 0:
// the cluster's default).
func (n *Node) MakeColdK(ctx context.Context, p string, k int, progress TierProgress) (TierResult, error) {
	if k != 0 {
		if _, err := n.StripeShapeK(k); err != nil {
			return TierResult{}, err
		}
	} else if _, err := n.StripeShape(); err != nil {
		return TierResult{}, err
	}
	files, pinned, err := n.tierFiles(ctx, p)
	if err != nil {
		return TierResult{}, err
	}
	res, err := n.makeColdBy(ctx, files, k, progress)
	res.Pinned = pinned
	return res, err
}

// ShardPolicy is k of the stripes by namespace path (serve --cold-shards
// PATH=K): the longest path at or above a file decides; a file under none
// gets the cluster's default (StripeShape). A conversion applies the
// member's own policy over the cluster's, kept in the namespace (kylix
// tier shards; shardRules in shardpolicy.go).
type ShardPolicy map[string]int

// ParseShardPolicy parses PATH=K specs (K data shards for the files at
// and below PATH; PATH "" or "/" is the whole namespace), refusing a K
// whose stripes would cost 1.5x or more or is past MaxStripeData, and a
// path given twice.
func ParseShardPolicy(specs []string) (ShardPolicy, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	sp := ShardPolicy{}
	for _, spec := range specs {
		p, kText, ok := strings.Cut(spec, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want PATH=K (K data shards for the files at and below PATH)", spec)
		}
		k, err := parseShards(kText)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", spec, err)
		}
		key := policyPath(p)
		if _, dup := sp[key]; dup {
			return nil, fmt.Errorf("%q: path %q given twice", spec, "/"+key)
		}
		sp[key] = k
	}
	return sp, nil
}

// policyPath is p as a namespace path without leading or trailing slash
// ("" for the whole namespace).
func policyPath(p string) string {
	p = path.Clean("/" + strings.TrimSpace(p))
	return strings.TrimPrefix(p, "/")
}

// longest returns the longest policy path at or above namespace path p,
// false when none is.
func (sp ShardPolicy) longest(p string) (string, bool) {
	p = policyPath(p)
	for {
		if _, ok := sp[p]; ok {
			return p, true
		}
		if p == "" {
			return "", false
		}
		if i := strings.LastIndexByte(p, '/'); i >= 0 {
			p = p[:i]
		} else {
			p = ""
		}
	}
}

// makeColdBy makes files cold in stripes of k data shards, or, with k 0,
// of the k the rules by path give each file's path (shardRules: the
// cluster's, this member's own over them), one conversion per k. A k the
// members alive now cannot hold, or a cluster rule whose K is not allowed,
// leaves its files warm and is named in the error, after the others were
// converted.
func (n *Node) makeColdBy(ctx context.Context, files []tierFile, k int, progress TierProgress) (TierResult, error) {
	var rules shardRules
	if k == 0 {
		var err error
		if rules, err = n.shardRules(); err != nil {
			return TierResult{}, err
		}
	}
	groups := map[int][]tierFile{}
	var errs []error
	var badRules []error
	leftWarm := map[error]int{}
	for _, f := range files {
		fk := k
		if fk == 0 {
			var err error
			if fk, err = rules.forFile(f.path); err != nil {
				if leftWarm[err] == 0 {
					badRules = append(badRules, err)
				}
				leftWarm[err]++
				continue
			}
		}
		groups[fk] = append(groups[fk], f)
	}
	for _, err := range badRules {
		errs = append(errs, fmt.Errorf("%d files left warm: %w", leftWarm[err], err))
	}
	ks := slices.Sorted(maps.Keys(groups))
	var res TierResult
	var shapes []string
	for _, gk := range ks {
		sh, err := n.StripeShapeK(gk)
		if err != nil {
			errs = append(errs, fmt.Errorf("%d files left warm: %w", len(groups[gk]), err))
			continue
		}
		r, err := n.makeCold(ctx, groups[gk], sh, progress)
		res.add(r)
		if r.Stripes > 0 {
			shapes = append(shapes, r.Shape)
		}
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	res.Shape = strings.Join(shapes, ", ")
	if len(shapes) == 0 && len(ks) == 1 {
		if sh, err := n.StripeShapeK(ks[0]); err == nil {
			res.Shape = sh.String()
		}
	}
	return res, errors.Join(errs...)
}

// add adds r's counts and lists to res (not its Shape).
func (res *TierResult) add(r TierResult) {
	res.Files += r.Files
	res.Changed = append(res.Changed, r.Changed...)
	res.Pinned = append(res.Pinned, r.Pinned...)
	res.Stripes += r.Stripes
	res.Chunks += r.Chunks
	res.Logical += r.Logical
	res.Parity += r.Parity
	res.Pushed += r.Pushed
	res.PushedBytes += r.PushedBytes
}

// MakeColdIdle makes cold, as MakeCold, the files of the namespace nobody
// read for idle or longer: last read (chunkstore's LastRead) before
// now-idle, or never read and last changed in the namespace (its entry's
// HLC: an import, a write; not the mtime, which an import copies from the
// source) before it. Files already
// cold and files under a pinned path are left alone. serve --cold-after
// runs it.
func (n *Node) MakeColdIdle(ctx context.Context, idle time.Duration) (TierResult, error) {
	all, _, err := n.tierFiles(ctx, "")
	if err != nil {
		return TierResult{}, err
	}
	before := time.Now().Add(-idle)
	var idleHere []tierFile
	for _, f := range all {
		if len(f.m.Stripes) > 0 {
			continue
		}
		last, ok := n.s.LastRead(f.id)
		if !ok {
			last = f.changed
		}
		if last.Before(before) {
			idleHere = append(idleHere, f)
		}
	}
	if len(idleHere) == 0 {
		return TierResult{}, nil
	}
	// Reads happen on every member (GPU nodes read through their own
	// mounts): each is asked when it last read these files.
	last, err := n.lastReadEverywhere(ctx, idleHere)
	if err != nil {
		return TierResult{}, err
	}
	var files []tierFile
	for i, f := range idleHere {
		if last[i].Before(before) {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		return TierResult{}, nil
	}
	return n.makeColdBy(ctx, files, 0, nil)
}

// lastReadEverywhere returns, for each file, the end of the last day any
// live member (readers included) read it, at least its last change. A
// member that cannot be asked is an error: nothing moves on a guess.
func (n *Node) lastReadEverywhere(ctx context.Context, files []tierFile) ([]time.Time, error) {
	last := make([]time.Time, len(files))
	for i, f := range files {
		last[i] = f.changed
		if t, ok := n.s.LastRead(f.id); ok && t.After(last[i]) {
			last[i] = t
		}
	}
	for _, p := range n.livePeers() {
		for start := 0; start < len(files); start += maxHasIDs {
			batch := files[start:min(start+maxHasIDs, len(files))]
			raw := make([]byte, 0, 32*len(batch))
			for _, f := range batch {
				raw = append(raw, f.id[:]...)
			}
			ans, err := n.request(ctx, p, request{op: opLastRead, raw: raw}, uint32(4*len(batch)))
			if err != nil {
				return nil, fmt.Errorf("asking member %s when it last read the idle files: %w", p.name, err)
			}
			if len(ans) != 4*len(batch) {
				return nil, fmt.Errorf("member %s answered %d bytes for %d files: %w", p.name, len(ans), len(batch), errProtocol)
			}
			for i := range batch {
				if d := binary.BigEndian.Uint32(ans[4*i:]); d > 0 {
					if t := time.Unix(int64(d)*86400, 0); t.After(last[start+i]) {
						last[start+i] = t
					}
				}
			}
		}
	}
	return last, nil
}

// makeCold is MakeCold's work on files.
func (n *Node) makeCold(ctx context.Context, files []tierFile, sh StripeShape, progress TierProgress) (TierResult, error) {
	// Shards stored on their holders before the manifests name them are
	// kept by their GC while this runs (lease.go).
	defer n.holdGC()()
	res := TierResult{Shape: sh.String()}
	// The chunks to code: those no stripe this node knows holds.
	seen := map[chunkstore.ID]bool{}
	var todo []chunkstore.ChunkRef
	var total int64
	for _, f := range files {
		for _, c := range f.m.Chunks {
			if seen[c.ID] || f.m.Coded(c.ID) != nil {
				continue
			}
			seen[c.ID] = true
			if _, ok := n.stripeOf(c.ID); ok {
				continue
			}
			todo = append(todo, c)
			total += int64(c.Len)
		}
	}
	var done int64
	if progress != nil {
		progress(0, total)
	}
	var recs []*stripe.Record
	for _, g := range stripe.Group(todo, sh.K) {
		// Every group is coded, the short last one too (its overhead is
		// above (k+m)/k, yet below the m+1 replicas that would survive as
		// many losses): a cold file survives m members lost, all of it.
		logical, raw := stripe.GroupRaw([][]chunkstore.ChunkRef{g}, sh.M)
		rec, err := n.encodeStripe(ctx, g, sh)
		if err != nil {
			return res, err
		}
		recs = append(recs, rec)
		if len(recs) == n.cfg.CrashAfterStripes {
			n.log.Warn("tier: crashing as asked (a test)", "stripes", len(recs))
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		res.Stripes++
		res.Chunks += len(g)
		res.Logical += logical
		res.Parity += raw - logical
		done += logical
		if progress != nil {
			progress(done, total)
		}
	}
	// Each file names every stripe one of its chunks is in: its own, the
	// new ones and those of other files.
	n.indexMore(recs)
	var changes []chunkstore.FileStripes
	for _, f := range files {
		var mine []*stripe.Record
		have := map[chunkstore.ID]bool{}
		for _, c := range f.m.Chunks {
			sm, ok := n.stripeOf(c.ID)
			if !ok || have[sm.id] {
				continue
			}
			have[sm.id] = true
			mine = append(mine, sm.rec)
		}
		if len(mine) == len(f.m.Stripes) {
			continue // nothing new for it
		}
		changes = append(changes, chunkstore.FileStripes{Path: f.path, Old: f.id, Stripes: mine})
	}
	if err := n.commitTier(changes, &res); err != nil {
		return res, err
	}
	return res, nil
}

// commitTier writes the files' new manifests in one namespace update and
// indexes their stripes at once (placement and the merge do it on the
// other members).
func (n *Node) commitTier(changes []chunkstore.FileStripes, res *TierResult) error {
	if len(changes) == 0 {
		return nil
	}
	_, changed, err := n.s.SetFilesStripes(changes)
	if err != nil {
		return err
	}
	res.Changed = changed
	res.Files = len(changes) - len(changed)
	if _, recs, err := n.namedChunks(n.ctx); err == nil {
		n.indexStripes(recs)
	}
	n.kickPlace()
	return nil
}

// encodeStripe codes one group of chunks and stores its shards (chunks
// this node lacks are fetched, verified, from the members).
func (n *Node) encodeStripe(ctx context.Context, g []chunkstore.ChunkRef, sh StripeShape) (*stripe.Record, error) {
	codec, err := n.codec(sh)
	if err != nil {
		return nil, err
	}
	data := make([]stripe.Chunk, len(g))
	for i, c := range g {
		b, err := n.s.ReadChunk(ctx, c.ID)
		if errors.Is(err, chunkstore.ErrNotLocal) {
			b, err = n.fetchDirect(ctx, c.ID, c.Len, nil) // from its holders, not a relay, kept nowhere: a conversion reads each once
		}
		if err != nil {
			return nil, fmt.Errorf("coding chunk %s: %w", c.ID.Short(), err)
		}
		data[i] = stripe.Chunk{ID: c.ID, Data: b}
	}
	rec, parity, err := codec.Encode(data, nil)
	if err != nil {
		return nil, err
	}
	sid, err := rec.ID()
	if err != nil {
		return nil, err
	}
	holders, err := stripeHolders(sid, n.placementMembers(), sh)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(holders))
	for i, p := range holders {
		id, _, ok := rec.ShardID(i)
		if !ok {
			continue // a known zero shard: not stored
		}
		b := parity[max(i-rec.K, 0)]
		if i < len(data) {
			b = data[i].Data
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.storeShardRetry(ctx, p, id, b)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("storing the shards of stripe %s: %w", sid.Short(), err)
	}
	return rec, nil
}

// shardTries and shardRetry: a shard that cannot be stored is tried again
// on its member as gossip names it then (a member that restarted has a
// new data plane address), after shardRetry, twice as long each time.
const (
	shardTries = 4
	shardRetry = 500 * time.Millisecond
)

// storeShardRetry is storeShard, tried again shardTries times at most.
func (n *Node) storeShardRetry(ctx context.Context, p peer, id chunkstore.ID, b []byte) error {
	var err error
	wait := shardRetry
	for try := 1; ; try++ {
		if err = n.storeShard(ctx, p, id, b); err == nil || try == shardTries {
			return err
		}
		n.log.Warn("tier: could not store a shard; trying again", "member", p.name, "shard", id.Short(), "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
		if i := slices.IndexFunc(n.members(), func(m peer) bool { return m.name == p.name }); i >= 0 {
			p = n.members()[i]
		}
	}
}

// MakeWarm gives the chunks of the cold files at and below p back to
// replicas: it stores each chunk on its R owners (fetched from its home
// or rebuilt from its stripe), then removes the stripes from the files'
// manifests in one namespace update, then checks the owners once more
// (a member's rebalance may have dropped a copy it did not own yet). A
// chunk that is also in the stripe of a file that stays cold keeps that
// stripe's home. The parity no manifest names any more is garbage.
func (n *Node) MakeWarm(ctx context.Context, p string, progress TierProgress) (TierResult, error) {
	defer n.holdGC()() // replicas pushed before the manifests change (lease.go)
	var res TierResult
	files, pinned, err := n.tierFiles(ctx, p)
	if err != nil {
		return res, err
	}
	res.Pinned = pinned
	var changes []chunkstore.FileStripes
	var refs []chunkstore.ChunkRef
	seen := map[chunkstore.ID]bool{}
	for _, f := range files {
		if len(f.m.Stripes) == 0 {
			continue
		}
		changes = append(changes, chunkstore.FileStripes{Path: f.path, Old: f.id})
		for _, c := range f.m.Chunks {
			if !seen[c.ID] {
				seen[c.ID] = true
				refs = append(refs, c)
			}
		}
	}
	if err := n.pushReplicas(ctx, refs, progress, &res); err != nil {
		return res, err
	}
	if err := n.commitTier(changes, &res); err != nil {
		return res, err
	}
	return res, n.pushReplicas(ctx, refs, nil, &res)
}

// pushReplicas stores each of refs on those of its R owners (replica
// owners, whatever its stripe) that do not hold it.
func (n *Node) pushReplicas(ctx context.Context, refs []chunkstore.ChunkRef, progress TierProgress, res *TierResult) error {
	members := n.placementMembers()
	var total, done int64
	for _, c := range refs {
		total += int64(c.Len)
	}
	if progress != nil {
		progress(0, total)
	}
	for _, c := range refs {
		var b []byte
		for _, o := range owners(c.ID, members, n.cfg.Replicas) {
			if o.name == n.self && n.s.HasChunk(c.ID) {
				continue
			}
			if o.name != n.self {
				held, err := n.askHas(ctx, o, []chunkstore.ChunkRef{c})
				if err != nil {
					return fmt.Errorf("member %s: %w", o.name, err)
				}
				if held[0] {
					continue
				}
			}
			if b == nil {
				var err error
				if b, err = n.s.ReadChunk(ctx, c.ID); errors.Is(err, chunkstore.ErrNotLocal) {
					b, err = n.fetchDirect(ctx, c.ID, c.Len, nil) // from its holders, not a relay, kept nowhere: a conversion reads each once
				}
				if err != nil {
					return fmt.Errorf("chunk %s: %w", c.ID.Short(), err)
				}
			}
			if err := n.storeShard(ctx, o, c.ID, b); err != nil {
				return err
			}
			res.Pushed++
			res.PushedBytes += int64(len(b))
		}
		done += int64(c.Len)
		if progress != nil {
			progress(done, total)
		}
	}
	return nil
}
