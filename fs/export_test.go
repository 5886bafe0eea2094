package fs

// SetBeforeCommit makes f run fn before each commit batch. Call it before
// anything is written through the mount.
func SetBeforeCommit(f *FS, fn func()) { f.beforeCommit = fn }
