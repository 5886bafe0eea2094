package stripe

import "errors"

// The package's sentinel errors; each is returned wrapped, with the stripe
// or shard it is about.
var (
	// ErrBadShard: a shard whose length or BLAKE3 is not the one its
	// stripe record names (damaged, cut short, or another shard).
	ErrBadShard = errors.New("shard fails its check")
	// ErrTooFewShards: fewer than k good shards of a stripe were given, so
	// the chunks asked for cannot be rebuilt. Returned also wrapping
	// chunkstore.ErrNotLocal, which the mount answers with EIO.
	ErrTooFewShards = errors.New("too few good shards to rebuild the stripe")
)
