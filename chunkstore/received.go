package chunkstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Chunks received from other members (docs/design/gc.md, "Chunks received
// from members"). A cluster member pushes an import's chunks to their
// owners before the owners' namespaces name them: the namespace merge
// follows about a second later. GC removes what no head names, so a GC on
// an owner in between would remove the pushed copies. Each chunk stored by
// Importer.PutReceived is recorded with the time it was committed, and GC
// keeps an unnamed chunk received within ReceivedGrace as if it were named.
// (Placement's pulls and make-local store chunks the namespace here names
// already, through PutChunk: they are not recorded.)
//
// An import or a conversion can take longer than the grace: a member that
// pushes announces a GC lease for as long as it runs (peers' lease.go), and
// the cluster member gives the store a ReceivedHold, so that GC keeps what
// arrived after the oldest lease it knows of started, however long ago.

// DefaultReceivedGrace is how long GC keeps a chunk received from another member
// (Importer.PutReceived) that no head names yet: long past the second the
// namespace merge takes, short enough that the copies of an import that
// never committed on its member (it failed, or was interrupted, after
// streaming some chunks) are collected within the hour.
const DefaultReceivedGrace = time.Hour

// Now returns the store's wall clock (Options.Now): the clock received
// chunks' times are in.
func (s *Store) Now() time.Time { return s.clock.now() }

// ReceivedGrace returns the store's grace for received chunks
// (Options.ReceivedGrace).
func (s *Store) ReceivedGrace() time.Duration { return s.recvGrace }

// ReceivedHold tells GC which received chunks the cluster still needs past
// their grace: those received after since (Unix nanoseconds, this
// member's clock; 0 when no lease holds anything). known is false while
// the holder cannot tell yet (the member has not seen the membership since
// it started): GC then keeps every received chunk it has a record of.
type ReceivedHold func() (since int64, known bool)

// SetReceivedHold installs the cluster's hold (nil: none, the grace alone).
func (s *Store) SetReceivedHold(h ReceivedHold) {
	s.recv.mu.Lock()
	s.recv.hold = h
	s.recv.mu.Unlock()
}

// receivedFile, in the data directory, holds one 40-byte record per
// received chunk: its id and the commit time (Unix nanoseconds, big
// endian). Records are appended after each commit without a sync: a crash
// can lose the last ones, which only shortens their grace (placement pulls
// a collected copy again from the member that imported it). GC rewrites the
// file with the records still within the grace.
const receivedFile = "received"

const receivedRec = 40

// receivedSet is the received chunks in their grace, in memory and in
// receivedFile.
type receivedSet struct {
	mu     sync.Mutex
	at     map[ID]int64 // commit time, Unix nanoseconds
	pruned int          // len(at) after the last prune
	hold   ReceivedHold // the cluster's leases (SetReceivedHold); nil: none
}

// receivedCutoff returns the time (Unix nanoseconds) at or before which a
// received chunk no head names may be collected: the grace's start, or
// earlier while a lease holds (ReceivedHold). Caller holds recv.mu.
func (s *Store) receivedCutoffLocked() int64 {
	cutoff := s.clock.now().Add(-s.recvGrace).UnixNano()
	if s.recv.hold == nil {
		return cutoff
	}
	since, known := s.recv.hold()
	switch {
	case !known:
		return 0
	case since > 0 && since-1 < cutoff:
		return since - 1
	}
	return cutoff
}

// receivedCutoff is receivedCutoffLocked taking recv.mu.
func (s *Store) receivedCutoff() int64 {
	s.recv.mu.Lock()
	defer s.recv.mu.Unlock()
	return s.receivedCutoffLocked()
}

// receivedPruneMin: noteReceived drops the expired records itself once
// the list has doubled since the last prune and holds at least this many,
// so that a member whose GC never runs does not keep them all.
const receivedPruneMin = 1 << 16

func (s *Store) receivedPath() string { return filepath.Join(s.dir, receivedFile) }

// loadReceived reads receivedFile (at Open), every record in it: a lease
// (ReceivedHold) may still need those past the grace, and the next GC or
// prune drops what nothing needs. A cut last record (a crash while
// appending) is ignored; an unreadable file is logged and treated as
// empty, since it only ever delays collection.
func (s *Store) loadReceived() {
	s.recv.at = map[ID]int64{}
	b, err := os.ReadFile(s.receivedPath())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("reading the chunks received from members; they get no gc grace", "file", s.receivedPath(), "err", err)
		}
		return
	}
	for ; len(b) >= receivedRec; b = b[receivedRec:] {
		var id ID
		copy(id[:], b)
		s.recv.at[id] = int64(binary.BigEndian.Uint64(b[32:40]))
	}
	s.recv.pruned = len(s.recv.at)
}

// noteReceived records ids as received now (after their commit).
func (s *Store) noteReceived(ids []ID) {
	if len(ids) == 0 {
		return
	}
	now := s.clock.now().UnixNano()
	var buf bytes.Buffer
	s.recv.mu.Lock()
	defer s.recv.mu.Unlock()
	for _, id := range ids {
		s.recv.at[id] = now
		buf.Write(id[:])
		buf.Write(binary.BigEndian.AppendUint64(nil, uint64(now)))
	}
	f, err := os.OpenFile(s.receivedPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, filePerm)
	if err == nil {
		_, err = f.Write(buf.Bytes())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.log.Warn("recording chunks received from members; they keep their gc grace until this node restarts", "file", s.receivedPath(), "err", err)
	}
	if len(s.recv.at) >= max(2*s.recv.pruned, receivedPruneMin) {
		if err := s.rewriteReceived(s.receivedCutoffLocked(), nil); err != nil {
			s.log.Warn("pruning the list of chunks received from members", "err", err)
		}
	}
}

// receivedSince returns whether chunk id was received after cutoff (Unix
// nanoseconds). Caller holds gcMu exclusively (no commit runs).
func (s *Store) receivedSince(id ID, cutoff int64) bool {
	t, ok := s.recv.at[id]
	return ok && t > cutoff
}

// pruneReceived forgets the chunks received at or before cutoff and those
// stored chunks named by a head (live), and rewrites receivedFile. Caller
// holds gcMu exclusively.
func (s *Store) pruneReceived(cutoff int64, live map[ID]bool) error {
	s.recv.mu.Lock()
	defer s.recv.mu.Unlock()
	return s.rewriteReceived(cutoff, live)
}

// rewriteReceived is pruneReceived with recv.mu held.
func (s *Store) rewriteReceived(cutoff int64, live map[ID]bool) error {
	n := len(s.recv.at)
	var buf []byte
	for id, t := range s.recv.at {
		if t <= cutoff || live[id] {
			delete(s.recv.at, id)
			continue
		}
		buf = append(buf, id[:]...)
		buf = binary.BigEndian.AppendUint64(buf, uint64(t))
	}
	s.recv.pruned = len(s.recv.at)
	if n == 0 {
		return nil
	}
	if len(buf) == 0 {
		if err := os.Remove(s.receivedPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", s.receivedPath(), err)
		}
		return nil
	}
	tmp := s.receivedPath() + ".tmp"
	if err := os.WriteFile(tmp, buf, filePerm); err != nil {
		return fmt.Errorf("rewrite %s: %w", s.receivedPath(), err)
	}
	if err := os.Rename(tmp, s.receivedPath()); err != nil {
		return fmt.Errorf("rewrite %s: %w", s.receivedPath(), err)
	}
	return nil
}
