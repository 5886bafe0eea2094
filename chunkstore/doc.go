// Package chunkstore is Kylix's local content-addressed store.
//
// A chunk is a byte string named by its BLAKE3-256 hash (ID). Files are split
// into chunks format-aware (safetensors at tensor boundaries, everything else by
// content-defined chunking, see package chunking), and a file's new chunks are
// written contiguously into a pack file, each file's region 4 KiB-aligned. A file
// of at least LargeFileMin bytes whose chunks are all new gets a pack of its own
// holding exactly its bytes from offset 0, so it can be served by FUSE
// passthrough, O_DIRECT or cuFile as a plain file range.
//
// A crash-safe index (bbolt) maps chunk IDs to (pack, offset, length), holds the
// content-addressed manifests (files and directories) and the named heads of the
// namespace. Pack bytes are made durable (fdatasync) before the index transaction
// that references them commits, so after kill -9 at any point a reopened store
// holds every committed file intact; bytes written after the last commit are cut
// off (shared packs) or removed (packs no commit references) when the store opens.
//
// Every chunk read from disk is re-hashed before its bytes are returned; a chunk
// whose hash does not match is reported as ErrCorrupt and its bytes are never
// handed out.
//
// A Store is used by one process at a time (an flock on DIR/LOCK); within that
// process it is safe for concurrent use.
package chunkstore
