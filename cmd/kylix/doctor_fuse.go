package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// fuseUsable says whether `kylix serve` can mount as the calling user: as
// root, /dev/fuse must exist; any other user must be able to open it for
// reading and writing (it is often 0600 root) and needs a setuid-root
// fusermount3 to mount through. Checked as the caller, not as whoever could
// in principle: a node started by this user fails exactly where this says.
func fuseUsable(fuseDev string) (ok bool, detail string) {
	st, err := os.Stat(fuseDev)
	if err != nil {
		return false, fmt.Sprintf("%s missing (%v): kylix serve cannot mount; load the fuse module (modprobe fuse), or in a container pass the device (--device /dev/fuse)", fuseDev, err)
	}
	uid := os.Geteuid()
	if uid == 0 {
		return true, fmt.Sprintf("%s present; root mounts directly", fuseDev)
	}
	f, err := os.OpenFile(fuseDev, os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("%s is not usable by uid %d (%s): %v: kylix serve cannot mount as this user; run it as root, or let this user open %s (mode 0666, as the fuse3 package's udev rule sets it)",
			fuseDev, uid, describeNode(st), unwrapPathError(err), fuseDev)
	}
	f.Close()
	fm, err := findFusermount()
	if err != nil {
		return false, fmt.Sprintf("%s opens, but %v: a user other than root mounts through it (apt-get install fuse3)", fuseDev, err)
	}
	fst, err := os.Stat(fm)
	if err != nil {
		return false, fmt.Sprintf("%s opens, but %s: %v", fuseDev, fm, err)
	}
	sys, _ := fst.Sys().(*syscall.Stat_t)
	if fst.Mode()&fs.ModeSetuid == 0 || sys == nil || sys.Uid != 0 {
		return false, fmt.Sprintf("%s opens, but %s (%s) is not setuid root: a user other than root cannot mount; run kylix serve as root, or chmod u+s %s", fuseDev, fm, describeNode(fst), fm)
	}
	if err := unix.Access(fm, unix.X_OK); err != nil {
		return false, fmt.Sprintf("%s opens, but uid %d cannot run %s (%s): %v", fuseDev, uid, fm, describeNode(fst), err)
	}
	return true, fmt.Sprintf("%s opens for uid %d and %s is setuid root: kylix serve can mount as this user", fuseDev, uid, fm)
}

// findFusermount returns the path of fusermount3 (or fusermount).
func findFusermount() (string, error) {
	for _, n := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", errors.New("fusermount3 is not installed")
}

// describeNode gives a file's mode bits (setuid included) and owner.
func describeNode(st os.FileInfo) string {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return st.Mode().String()
	}
	return fmt.Sprintf("mode %04o, uid %d, gid %d", sys.Mode&0o7777, sys.Uid, sys.Gid)
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
