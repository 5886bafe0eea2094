package layout

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Query asks the open Kylix file fd for the extents of [off, off+n), n == 0
// meaning to the end of the file. At most MaxExtents come back; continue
// from Reply.NextOffset.
func Query(fd int, off, n uint64) (Reply, error) {
	b := EncodeRequest(Request{Offset: off, Length: n})
	if err := ioctl(fd, CmdLayout, b); err != nil {
		return Reply{}, fmt.Errorf("layout: KYLIX_IOC_LAYOUT: %w", err)
	}
	return DecodeReply(b)
}

// PackPath asks the open Kylix file fd for the path of pack id.
func PackPath(fd int, id uint64) (string, error) {
	b := EncodePackPathRequest(id)
	if err := ioctl(fd, CmdPackPath, b); err != nil {
		return "", fmt.Errorf("layout: KYLIX_IOC_PACK_PATH: %w", err)
	}
	return DecodePackPathReply(b)
}

// Raw issues ioctl cmd on fd with buf as its argument (tests use it to send
// malformed requests).
func Raw(fd int, cmd uint32, buf []byte) error { return ioctl(fd, cmd, buf) }

func ioctl(fd int, cmd uint32, b []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(unsafe.Pointer(&b[0])))
	if errno != 0 {
		return errno
	}
	return nil
}
