package chunkstore

import (
	"context"
	"sync"
	"time"
)

// Read-ahead of missing chunks (docs/design/peers.md, "Fetching"). When a
// File is read sequentially and its next chunks are not stored here, they
// are asked of the Fetcher ahead of the reader: a window of at most
// ReadAheadChunks chunks (and at most ReadAheadBytes, and a quarter of the
// chunk cache) past the furthest chunk read, requested in file order with
// at most readAheadInFlight of one file in flight, so the chunk the reader
// needs next is always the first asked for. They land in the store's chunk
// cache, where the reader's next read finds them (or waits for the fetch in
// flight: single flight). The window moves only when the reader reads: a
// reader that stops leaves at most one window fetched; a read elsewhere in
// the file (a jump) starts over from there, and the window grows again once
// reads follow on. Local chunks are left to File.Prefetch and the disk.
//
// The windows of all the files being read at once share a quarter of the
// chunk cache: each gets an equal part (readAheadBudget). Otherwise, with
// many files read at once, chunks fetched ahead would be evicted from the
// cache before their reader got to them, and fetched again (eight files of
// a model read at once fetched 1.5 times their chunks with a window each).

const (
	// DefaultReadAheadChunks is the window's length in chunks
	// (Options.ReadAheadChunks).
	DefaultReadAheadChunks = 16
	// ReadAheadBytes bounds the window in bytes.
	ReadAheadBytes = 64 << 20
	// readAheadInFlight bounds the fetches of one file's window at once
	// (the rest of the window waits, in file order).
	readAheadInFlight = 16
)

// readAhead follows one File's reader.
type readAhead struct {
	mu sync.Mutex
	// pos is the chunk after the furthest chunk the reader read; hi the
	// first chunk of the window not asked for yet (hi >= pos); read says
	// whether any read came yet.
	pos, hi  int
	read     bool
	inflight int
	// budget is the most bytes the window may span (readAheadBudget, as
	// of the reader's last read).
	budget int64
}

// readAheadActive is how long after its last read a file still counts as
// read, sharing the read-ahead budget.
const readAheadActive = 2 * time.Second

// raReaders knows the files read lately, to share the read-ahead budget
// among them.
type raReaders struct {
	mu     sync.Mutex
	last   map[*readAhead]time.Time
	pruned time.Time
}

// note records a read of ra's file at now and returns how many files are
// being read (those read within readAheadActive, or up to twice that
// before they are pruned).
func (r *raReaders) note(ra *readAhead, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[*readAhead]time.Time{}
	}
	r.last[ra] = now
	if now.Sub(r.pruned) > readAheadActive {
		for k, t := range r.last {
			if now.Sub(t) > readAheadActive {
				delete(r.last, k)
			}
		}
		r.pruned = now
	}
	return len(r.last)
}

// readAheadBudget is the bytes one file's window may span when readers
// files are being read: an equal part of a quarter of the chunk cache, at
// most ReadAheadBytes.
func (s *Store) readAheadBudget(readers int) int64 {
	return min(int64(ReadAheadBytes), s.cache.max/4/int64(max(readers, 1)))
}

// ReadAheadWindow is the read-ahead window's length in chunks; 0: off.
func (s *Store) ReadAheadWindow() int {
	switch w := s.opts.ReadAheadChunks; {
	case w < 0:
		return 0
	case w == 0:
		return DefaultReadAheadChunks
	default:
		return w
	}
}

// readingAhead notes a read of chunks [first, last] of f and moves the
// window: sequential reads (starting at most four chunks before where the
// reader got to, and no further than the window asked for) push it on; any
// other read starts it over after last.
func (f *File) readingAhead(first, last int) {
	ra, window := f.ra, f.s.ReadAheadWindow()
	if _, alone := f.s.fetcher.(LocalOnly); ra == nil || window == 0 || alone {
		return // a store alone has nothing to fetch ahead
	}
	readers := f.s.raReaders.note(ra, time.Now())
	ra.mu.Lock()
	defer ra.mu.Unlock()
	ra.budget = f.s.readAheadBudget(readers)
	seq := (!ra.read && first == 0) || (ra.read && first >= ra.pos-4 && first <= max(ra.hi, ra.pos))
	ra.read = true
	if !seq {
		ra.pos, ra.hi = last+1, last+1
		return
	}
	ra.pos = max(ra.pos, last+1)
	ra.hi = max(ra.hi, ra.pos)
	f.pumpLocked(window)
}

// pumpLocked asks for the next chunks of the window, in file order, while
// fewer than readAheadInFlight are in flight. ra.mu is held.
func (f *File) pumpLocked(window int) {
	ra := f.ra
	budget := ra.budget
	end := min(ra.pos+window, len(f.M.Chunks))
	for ra.hi < end && ra.inflight < readAheadInFlight {
		i := ra.hi
		if f.offs[i+1]-f.offs[ra.pos] > budget {
			return
		}
		ra.hi++
		if f.locs[i].Pack != 0 || f.s.cache.present(f.M.Chunks[i].ID) {
			continue // local (File.Prefetch's), cached or being read
		}
		e, owner := f.s.cache.claim(f.M.Chunks[i].ID)
		if !owner {
			continue
		}
		ra.inflight++
		go f.fetchAhead(i, e, window)
	}
}

// fetchAhead fetches chunk i into the cache (entry e, claimed), counts it,
// and moves the window on.
func (f *File) fetchAhead(i int, e *cacheEntry, window int) {
	refs, locs := f.M.Chunks[i:i+1], f.locs[i:i+1]
	f.s.load(context.Background(), refs, locs, []*cacheEntry{e}, []int{0}, true)
	<-e.ready
	if e.err == nil {
		f.s.ctr.readAheadChunks.Add(1)
		f.s.ctr.readAheadBytes.Add(int64(refs[0].Len))
	}
	ra := f.ra
	ra.mu.Lock()
	ra.inflight--
	f.pumpLocked(window)
	ra.mu.Unlock()
}
