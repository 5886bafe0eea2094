package fs

// SetBeforeCommit makes f run fn before each commit batch. Call it before
// anything is written through the mount.
func SetBeforeCommit(f *FS, fn func()) { f.beforeCommit = fn }

// SetBeforeRelease makes f run fn at the start of each RELEASE (write: of
// a handle that may write), and what fn returns, if not nil, at its end.
// Call it before anything is opened.
func SetBeforeRelease(f *FS, fn func(write bool) func()) { f.beforeRelease = fn }

// PendingCloses returns how many writing handles were closed and wait
// for their RELEASE (what Sync waits for).
func PendingCloses(f *FS) int {
	f.closes.mu.Lock()
	defer f.closes.mu.Unlock()
	return f.closes.n
}
