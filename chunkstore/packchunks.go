package chunkstore

// Checks of one file's chunks inside a pack it shares with other files, for
// the LD_PRELOAD shim (docs/design/preload.md): the node hands such a pack's
// descriptor to a client only after every chunk of the file that the index
// places in it was hashed against the file's manifest, in the pack state
// (identity) the client will see. The same rule as the passthrough pack
// check (packverify.go), restricted to the file's own chunks: a client
// re-checks the identity (its generation) before every read.

import (
	"context"
	"fmt"
	"os"
	"sync"
)

// chunkChecks records passed checks by (pack, file) with the pack identity
// they hashed. Failed checks are not recorded: the next request hashes
// again (and fails again while the pack is damaged).
type chunkChecks struct {
	mu   sync.Mutex // held during a check: one check at a time per store
	recs map[packFileKey]PackIdentity
}

// OpenCheckedChunks returns a read-only descriptor of pack after proving
// every chunk of f whose index location is in pack: each is read at its
// location and hashed against f's manifest, once per state of the pack
// file (a later request with an unchanged identity is answered from the
// record). Errors: ErrNotLocal (the pack is gone), ErrCorrupt (a chunk
// does not match; logged), errPackChanged (the pack changed while hashed).
func (s *Store) OpenCheckedChunks(ctx context.Context, f *File, pack uint64) (*os.File, error) {
	ls, err := s.packs.acquire(pack)
	if err != nil {
		return nil, fmt.Errorf("open pack %d holding chunks of file %s: %w", pack, f.ID.Short(), err)
	}
	fh, err := os.Open(ls.Path())
	ls.Release()
	if err != nil {
		return nil, fmt.Errorf("open pack %d holding chunks of file %s: %w", pack, f.ID.Short(), err)
	}
	ok := false
	defer func() {
		if !ok {
			fh.Close()
		}
	}()
	before, err := fileIdentity(fh)
	if err != nil {
		return nil, err
	}
	key := packFileKey{pack, f.ID}
	c := &s.pchunks
	c.mu.Lock()
	defer c.mu.Unlock()
	if id, done := c.recs[key]; done && id == before {
		ok = true
		return fh, nil
	}
	var buf []byte
	var n int64
	for i, l := range f.locs {
		if l.Pack != pack {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if cap(buf) < int(l.Len) {
			buf = make([]byte, l.Len)
		}
		b := buf[:l.Len]
		if _, err := fh.ReadAt(b, l.Off); err != nil {
			return nil, fmt.Errorf("pack %s: read chunk %s at %d: %w", fh.Name(), f.M.Chunks[i].ID.Short(), l.Off, err)
		}
		if Sum(b) != f.M.Chunks[i].ID {
			err := fmt.Errorf("pack %s: chunk %s of file %s at pack offset %d does not match its hash (run kylix verify): %w",
				fh.Name(), f.M.Chunks[i].ID.Short(), f.ID.Short(), l.Off, ErrCorrupt)
			s.log.Error("pack failed the check of a file's chunks; not handed out", "err", err)
			return nil, err
		}
		n += int64(l.Len)
	}
	after, err := fileIdentity(fh)
	if err != nil {
		return nil, err
	}
	if after != before {
		return nil, fmt.Errorf("pack %s, checked for file %s: %w", fh.Name(), f.ID.Short(), errPackChanged)
	}
	if c.recs == nil {
		c.recs = map[packFileKey]PackIdentity{}
	}
	c.recs[key] = before
	s.pverify.bytes.Add(n)
	ok = true
	return fh, nil
}
