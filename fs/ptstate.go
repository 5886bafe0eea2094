package fs

import "github.com/kylix/kylix/chunkstore"

// backgroundCheckRate is the pace (bytes/s) of a pack check started by an
// open that does not wait for it (chunkstore.TryOpenPassthrough): the
// scrub's rate, or chunkstore.DefaultScrubRate when the scrub is off, so
// the check leaves the disk to the first reads; the node's own reads of
// the whole file usually prove the pack first (docs/design/verification.md).
func (f *FS) backgroundCheckRate() int64 {
	if f.opts.ScrubRate > 0 {
		return f.opts.ScrubRate
	}
	return chunkstore.DefaultScrubRate
}

// servedByText says who serves opens of sf now, for user.kylix.path and
// kylix stat: "passthrough", or "daemon" with the reason when it is not
// the plain daemon case.
func (f *FS) servedByText(sf *chunkstore.File) string {
	if sf == nil || !f.passthrough {
		return "daemon"
	}
	_, c, ok := f.s.PackState(sf)
	switch {
	case !ok:
		return "daemon"
	case c == nil && sf.Size() > chunkstore.InlineCheckMax:
		return "daemon (the node, until the pack check finishes; then passthrough)"
	case c == nil || c.OK():
		return "passthrough"
	}
	return "daemon"
}
