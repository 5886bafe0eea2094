package chunkstore

import (
	"errors"
	"sync/atomic"

	"github.com/kylix/kylix/chunkstore/storeio"
)

// Counters counts what the store did since it was opened, for the node's
// metrics (docs/design/metrics.md). They only grow.
type Counters struct {
	// CacheHits counts chunk lookups the chunk cache answered without a
	// storage read: the chunk was cached, or another reader's read of it
	// was in flight and was shared. CacheMisses counts lookups that read
	// the chunk from storage (or asked the Fetcher). A lookup answered by
	// a failure remembered (DefaultFailTTL) is neither. Prefetches count.
	CacheHits   int64 `json:"cache_hits"`
	CacheMisses int64 `json:"cache_misses"`
	// Chunk read failures by kind, one per attempt (a failure is
	// remembered for DefaultFailTTL, and the readers that meet it then do
	// not count again): bytes that fail their hash or a short pack
	// (ErrCorrupt), an I/O error from the disk (ReadError), a chunk not
	// stored here (ErrNotLocal), anything else.
	ChunkCorrupt   int64 `json:"chunk_corrupt"`
	ChunkReadError int64 `json:"chunk_read_error"`
	ChunkNotLocal  int64 `json:"chunk_not_local"`
	ChunkOther     int64 `json:"chunk_other"`
	// ImportBytes counts bytes read from sources by Import; ExportBytes
	// bytes written by Export.
	ImportBytes int64 `json:"import_bytes"`
	ExportBytes int64 `json:"export_bytes"`
	// ReadAheadChunks and ReadAheadBytes count the missing chunks fetched
	// ahead of sequential readers (readahead.go).
	ReadAheadChunks int64 `json:"read_ahead_chunks"`
	ReadAheadBytes  int64 `json:"read_ahead_bytes"`
}

// counters are the live Counters.
type counters struct {
	corrupt, readError, notLocal, otherChunkErrors atomic.Int64
	importBytes, exportBytes                       atomic.Int64
	readAheadChunks, readAheadBytes                atomic.Int64
}

// Counters returns the store's counters.
func (s *Store) Counters() Counters {
	c := &s.ctr
	return Counters{
		CacheHits: s.cache.hits.Load(), CacheMisses: s.cache.misses.Load(),
		ChunkCorrupt: c.corrupt.Load(), ChunkReadError: c.readError.Load(),
		ChunkNotLocal: c.notLocal.Load(), ChunkOther: c.otherChunkErrors.Load(),
		ImportBytes: c.importBytes.Load(), ExportBytes: c.exportBytes.Load(),
		ReadAheadChunks: c.readAheadChunks.Load(), ReadAheadBytes: c.readAheadBytes.Load(),
	}
}

// Kinds of chunk failure (FailureKind), as the metrics label them.
const (
	KindCorrupt   = "corrupt"
	KindReadError = "read_error"
	KindNotLocal  = "not_local"
	KindOther     = "other"
)

// FailureKind names the kind of a failed chunk read: KindCorrupt (bytes
// that fail their hash, a short pack), KindReadError (an I/O error from the
// disk), KindNotLocal (not stored here) or KindOther; "" for nil and for a
// store that is closing (nothing is wrong with the chunk).
func FailureKind(err error) string {
	var re *ReadError
	switch {
	case err == nil, errors.Is(err, ErrClosed), errors.Is(err, storeio.ErrClosed):
		return ""
	case errors.Is(err, ErrCorrupt):
		return KindCorrupt
	case errors.As(err, &re):
		return KindReadError
	case errors.Is(err, ErrNotLocal):
		return KindNotLocal
	}
	return KindOther
}

// chunkFailed counts one failed chunk read attempt by its kind.
func (c *counters) chunkFailed(err error) {
	switch FailureKind(err) {
	case KindCorrupt:
		c.corrupt.Add(1)
	case KindReadError:
		c.readError.Add(1)
	case KindNotLocal:
		c.notLocal.Add(1)
	case KindOther:
		c.otherChunkErrors.Add(1)
	}
}
