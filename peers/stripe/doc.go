// Package stripe is the Reed-Solomon codec of coded (cold) data
// (docs/design/erasure.md): a stripe codes up to k whole chunks of
// immutable files with m parity shards (klauspost/reedsolomon). Data shard
// i is chunk i itself, zero-padded to the stripe's shard size only while it
// is coded (the padding is never stored nor sent), so a healthy read is the
// plain fetch of one chunk; a parity shard is stored like a chunk under the
// BLAKE3 of its bytes.
//
// A stripe's Record names its chunks (ids and lengths), k, m, the shard size
// and the BLAKE3 of each parity shard, with one canonical encoding and an id
// of its own. Decoding checks every shard it is given against its BLAKE3
// before using it (a data shard's is its chunk id) and every rebuilt chunk
// against its id after: a lying shard is dropped as if missing, and more bad
// or missing shards than m give an error, never wrong bytes.
//
// stripe depends on chunkstore (ids and their hash) only; placing shards on
// members is peers' (docs/design/erasure.md, "Placement").
package stripe
