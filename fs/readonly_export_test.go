package fs

// ReadOnlyOpens is how many OPEN requests reached a read-only mount's
// node (the kernel stops sending them after the first ENOSYS).
func (f *FS) ReadOnlyOpens() int64 {
	if f.ro == nil {
		return -1
	}
	return f.ro.opens.Load()
}
