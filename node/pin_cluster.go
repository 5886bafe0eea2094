package node

// Pins and warm-up across the cluster (docs/design/pin.md, "In a
// cluster"): a pin first brings the chunks of its path that this node does
// not store from the members into its packs; warm fetches them into the
// peer cache.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers"
)

// clusterInFlight bounds the chunks a pin or a warm asks the members for
// at once.
const clusterInFlight = 16

// errNotHere: a chunk of a path to pin is not stored on this node.
var errNotHere = errors.New("not stored on this node")

// missingChunk is a chunk of a path that this node does not store, with
// the first file (and offset in it) found to need it.
type missingChunk struct {
	ref  chunkstore.ChunkRef
	file string
	off  int64
}

// missingBelow lists, once each, the chunks of the files at and below path
// that are not stored in this node's packs.
func missingBelow(ctx context.Context, s *chunkstore.Store, path string) ([]missingChunk, int64, error) {
	var miss []missingChunk
	var bytes int64
	seen := map[chunkstore.ID]bool{}
	files := map[chunkstore.ID]bool{}
	err := s.Walk(path, func(fp string, e chunkstore.Entry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.Kind != chunkstore.KindFile || files[e.ID] {
			return nil
		}
		files[e.ID] = true
		f, err := s.OpenFile(e.ID)
		if err != nil {
			return fmt.Errorf("%s: %w", fp, err)
		}
		plan, err := f.Plan(0, f.Size())
		if err != nil {
			return fmt.Errorf("%s: %w", fp, err)
		}
		defer plan.Release()
		for _, pc := range plan.Missing() {
			if seen[pc.ID] {
				continue
			}
			seen[pc.ID] = true
			miss = append(miss, missingChunk{ref: chunkstore.ChunkRef{ID: pc.ID, Len: uint32(pc.Len)}, file: fp, off: pc.FileOff})
			bytes += pc.Len
		}
		return nil
	})
	if errors.Is(err, chunkstore.ErrNotFound) {
		return nil, 0, fmt.Errorf("no such path in the namespace (kylix ls shows what is there)")
	}
	return miss, bytes, err
}

// bringHere fetches the missing chunks from the members, clusterInFlight
// at once, each checked against its id, and writes them into this node's
// shared packs (the importer checks again); what arrived is committed even
// when a chunk fails. A chunk no member can send fails the whole, naming
// the file and offset that need it. It returns the chunks and bytes
// stored.
func bringHere(ctx context.Context, progress Progress, s *chunkstore.Store, n *peers.Node, label string, miss []missingChunk) (int, int64, error) {
	var total int64
	for _, m := range miss {
		total += int64(m.ref.Len)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	im := s.NewImporter()
	var (
		mu     sync.Mutex // im, stored, first, progress
		stored int
		bytes  int64
		first  error
		done   atomic.Int64
		wg     sync.WaitGroup
		sem    = make(chan struct{}, clusterInFlight)
	)
	fail := func(err error) {
		if first == nil {
			first = err
			cancel()
		}
	}
	for _, m := range miss {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			data, err := n.FetchToStore(ctx, m.ref.ID, m.ref.Len)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fail(fmt.Errorf("%s: %s at offset %d (chunk %s): no member could send it: %w",
					m.file, human(int64(m.ref.Len)), m.off, m.ref.ID.Short(), err))
				return
			}
			if err := im.PutChunk(m.ref.ID, data); err != nil {
				fail(fmt.Errorf("%s: storing the chunk at offset %d here: %w", m.file, m.off, err))
				return
			}
			stored++
			bytes += int64(len(data))
			if im.PendingBytes() >= 64<<20 {
				if err := im.Flush(); err != nil {
					fail(fmt.Errorf("committing fetched chunks: %w", err))
				}
			}
			progress.report(label, done.Add(int64(len(data))), total)
		}()
	}
	wg.Wait()
	if err := im.Close(); err != nil && first == nil {
		first = fmt.Errorf("committing fetched chunks: %w", err)
	}
	if first == nil {
		first = ctx.Err()
	}
	return stored, bytes, first
}
