package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ClearStaleMount detaches a FUSE mount at dir whose server is gone (a node
// killed with kill -9 leaves one: every access fails with ENOTCONN). It
// reports whether it cleared one. A live mount at dir is an error: another
// node serves it.
func ClearStaleMount(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, fmt.Errorf("mount point %s: %w", dir, err)
	}
	if !isMountPoint(abs) {
		return false, nil
	}
	// statfs always asks the server (attributes may come from the
	// kernel's cache): a dead one answers ENOTCONN.
	var st unix.Statfs_t
	err = unix.Statfs(abs, &st)
	switch {
	case errors.Is(err, unix.ENOTCONN), errors.Is(err, unix.ECONNABORTED):
	case err == nil:
		return false, fmt.Errorf("%s is already a mount point (another node, or another file system); unmount it first", abs)
	default:
		return false, fmt.Errorf("mount point %s: %w", abs, err)
	}
	if err := unix.Unmount(abs, unix.MNT_DETACH); err != nil {
		return false, fmt.Errorf("clear stale mount %s: %w", abs, err)
	}
	return true, nil
}

// isMountPoint reports whether /proc/self/mountinfo lists dir as a mount
// point.
func isMountPoint(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && unescapeMount(fields[4]) == dir {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
