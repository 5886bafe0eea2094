// Package fs mounts a Kylix store's namespace as a POSIX file system with
// FUSE (hanwen/go-fuse/v2), so that unmodified programs (PyTorch, vLLM, cp,
// sha256sum) open models and datasets as plain files.
//
// Reads: a file's content is immutable for a given manifest ID, so the
// kernel may cache it (long entry/attribute timeouts, FOPEN_KEEP_CACHE, 1 MiB
// requests). A file whose backing pack holds exactly its bytes from offset 0
// is served by FUSE passthrough once that pack passed its check
// (chunkstore.Store.OpenPassthrough: hashed whole at its first open after a
// boot or a change; docs/design/verification.md): the kernel reads the pack
// itself. Every other file is read through the store, every chunk verified
// against its hash.
//
// Writes: a file opened for writing gets a private working copy under the
// data directory's tmp/; when the last writer closes it (or on fsync) the
// copy is imported as a new content-addressed version and the namespace is
// updated in one transaction (group-committed with other closes). A reader
// never sees a half-committed file; a crash loses only uncommitted writes.
//
// The open files answer the layout ioctls of package layout.
//
// docs/design/fs.md has the semantics (close-to-open, what a reader sees
// while a writer is open), the caching rules and the passthrough rule.
package fs
