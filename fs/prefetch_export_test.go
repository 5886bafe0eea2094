package fs

// PrefetchIdle waits until the directory prefetch passes under way end.
func (f *FS) PrefetchIdle() { f.pf.wait() }
