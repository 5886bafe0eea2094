package chunkstore

// Sealing a shared pack before its descriptor leaves the node
// (docs/design/client.md, "A handed-out pack never grows"). A pack fd given
// to a client reads the whole pack file, now and later; so a pack is handed
// out only once nothing will ever be appended to it. Only the store's
// current shared pack takes appends (exclusive packs and compaction's
// packs are written once, before their commit, and never again; a new run
// of the store starts a new shared pack), so sealing a pack is: if it is
// the current shared pack, stop appending to it (the next small file
// starts a new one). At most one such rotation per SealInterval: a
// hand-out asked sooner is refused for that pack, and the caller reads
// those chunks through the mount, which is always safe.

import (
	"errors"
	"fmt"
	"time"
)

// DefaultSealInterval bounds how often handing out the current shared pack
// rotates it (Options.SealInterval).
const DefaultSealInterval = time.Second

// ErrPackOpen: the pack still takes appends and was not sealed now (a
// rotation happened less than SealInterval ago); it must not be handed out.
var ErrPackOpen = errors.New("the pack still takes appends")

// sealState counts what SealForHandout did (SealStats).
type sealState struct {
	last    time.Time // the latest rotation it made
	sealed  uint64    // rotations made
	refused uint64    // requests refused by the interval
}

// SealForHandout makes sure nothing is ever appended to pack again, so
// that a descriptor of it opened from now on reads only bytes already
// there. It returns nil when the pack takes no more appends (it is not the
// current shared pack, or it was just rotated out), and an error wrapping
// ErrPackOpen when it is the current shared pack and the last rotation is
// less than SealInterval ago: the pack must then not be handed out.
//
// sharedMu is taken, so an append in progress ends before the decision
// and the next one goes to a new pack.
func (s *Store) SealForHandout(pack uint64) error {
	// Most packs handed out are not the current shared pack: answer those
	// without waiting for an append in progress (sharedMu), which starved
	// shim readers under write load. A pack that is not current now never
	// becomes current (ids are never reused, and a pack holds bytes only
	// once it was made current), so the answer stays true.
	s.mu.Lock()
	cur := s.shared
	s.mu.Unlock()
	if cur == nil || cur.id != pack {
		return nil
	}
	s.sharedMu.Lock()
	defer s.sharedMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.shared
	if sp == nil || sp.id != pack {
		return nil
	}
	now := time.Now()
	if s.opts.Now != nil {
		now = s.opts.Now()
	}
	if iv := s.opts.SealInterval; iv > 0 && !s.seal.last.IsZero() && now.Sub(s.seal.last) < iv {
		s.seal.refused++
		return fmt.Errorf("pack %d is the store's current shared pack and was not sealed now (at most one rotation per %v): %w", pack, iv, ErrPackOpen)
	}
	// The file is not closed here: importers that appended to it still
	// hold it in their dirty list and sync it at their next Flush
	// (sharedPackFor says the same).
	s.shared = nil
	s.seal.last = now
	s.seal.sealed++
	return nil
}

// SealStats reports how many shared packs SealForHandout rotated and how
// many hand-outs it refused because the last rotation was too recent.
func (s *Store) SealStats() (sealed, refused uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seal.sealed, s.seal.refused
}
