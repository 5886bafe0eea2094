package fs_test

import (
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"

	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// posixSkips are the posixtest cases that do not apply to Kylix, with the
// reason (also listed in docs/design/fs.md).
var posixSkips = map[string]string{
	"XAttr":               "arbitrary extended attributes are not stored (an entry has no xattr field); only the read-only user.kylix.* attributes exist",
	"FcntlFlockLocksFile": "record locks are kept by the kernel on the node (the mount does not forward locks); two fds of one process share POSIX locks there, and the test expects the per-open-file behaviour of a file system that forwards locks",
	"XAttrLarge":          "arbitrary extended attributes are not stored (see XAttr)",
}

func TestPosix(t *testing.T) {
	fstest.RequireFUSE(t)
	var names []string
	for n := range posixtest.All {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		fn := posixtest.All[name]
		t.Run(name, func(t *testing.T) {
			if why, ok := posixSkips[name]; ok {
				t.Skip(why)
			}
			m := fstest.Mount(t, kfs.Options{})
			fn(t, m.Dir)
		})
	}
}
