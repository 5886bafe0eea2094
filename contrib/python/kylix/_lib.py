"""The one ctypes binding of libkylix, tolerant of its absence.

libkylix (contrib/libkylix, kylix.h) is found at $KYLIX_LIB, else inside this
package (the wheel carries it), else at bin/libkylix.so of the source tree
this package sits in. If none loads, or a symbol we need is missing, lib()
returns None and callers read the file with plain preads: the library is a
fast path, never a requirement.

The binding follows contrib/libkylix/kylix.h, KYLIX_ABI_VERSION 1:
kylix_abi_version, kylix_open, kylix_close, kylix_pread (with struct
kylix_read_info: bytes_pack, bytes_fuse, pack_fallbacks, reads, char path[16]),
kylix_strerror, kylix_last_error. A library of another ABI version is not
used (we fall back to preads and say why). Functions added to the library
later, without an ABI change, are bound only where the loaded library has
them: kylix_tar_scan (tar_scan(); kylix.data's shard reader falls back to
its Python parser without it, and says so).
"""

from __future__ import annotations

import ctypes
import os
import threading

_lock = threading.Lock()
_lib = None
_tried = False
_why = ""
_tar_scan = None
_tar_scan_why = ""

ABI_VERSION = 1


class ReadInfo(ctypes.Structure):
    """struct kylix_read_info of kylix.h."""
    _fields_ = [("bytes_pack", ctypes.c_uint64), ("bytes_fuse", ctypes.c_uint64),
                ("pack_fallbacks", ctypes.c_uint64), ("reads", ctypes.c_uint64),
                ("path", ctypes.c_char * 16)]


def _candidates():
    env = os.environ.get("KYLIX_LIB")
    if env:
        yield env
        return  # an explicit choice is not second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libkylix.so")
    # contrib/python/kylix -> repository root
    yield os.path.join(here, "..", "..", "..", "bin", "libkylix.so")


def lib():
    """The loaded library, or None (see why())."""
    global _lib, _tried, _why
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("KYLIX_NO_LIB"):
            _why = "KYLIX_NO_LIB is set"
            return None
        for path in _candidates():
            if not os.path.exists(path):
                _why = f"{path} does not exist"
                continue
            try:
                L = ctypes.CDLL(path)
                L.kylix_abi_version.argtypes = []
                L.kylix_abi_version.restype = ctypes.c_int
                abi = L.kylix_abi_version()
                if abi != ABI_VERSION:
                    _why = f"{path}: ABI version {abi}, this binding speaks {ABI_VERSION}"
                    continue
                L.kylix_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
                L.kylix_open.restype = ctypes.c_int
                L.kylix_close.argtypes = [ctypes.c_void_p]
                L.kylix_close.restype = None
                L.kylix_pread.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_uint64, ctypes.POINTER(ReadInfo)]
                L.kylix_pread.restype = ctypes.c_ssize_t
                L.kylix_strerror.argtypes = [ctypes.c_int]
                L.kylix_strerror.restype = ctypes.c_char_p
                L.kylix_last_error.argtypes = []
                L.kylix_last_error.restype = ctypes.c_char_p
            except (OSError, AttributeError) as e:
                _why = f"{path}: {e}"
                continue
            _lib = L
            _why = f"loaded {path}"
            _bind_optional(L, path)
            return _lib
        return None


def _bind_optional(L, path):
    global _tar_scan, _tar_scan_why
    try:
        f = L.kylix_tar_scan
    except AttributeError:
        _tar_scan_why = f"{path} has no kylix_tar_scan (an older libkylix: make build)"
        return
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                  ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint64)]
    f.restype = ctypes.c_int
    _tar_scan = f
    _tar_scan_why = f"kylix_tar_scan of {path}"


# kylix.h's kylix_tar_member: TAR_FIELDS uint64_t, in this order (an array
# of them is read as one array of integers), and the stop reasons and flag.
TAR_FIELDS = 10
TAR_HEADER_OFFSET, TAR_DATA_OFFSET, TAR_SIZE, TAR_NEXT_OFFSET, TAR_NAME_LEN, TAR_PREFIX_LEN, \
    TAR_KEY_LEN, TAR_TYPE, TAR_FLAGS, TAR_RESERVED = range(TAR_FIELDS)
TAR_MORE, TAR_FULL, TAR_END, TAR_OTHER = 0, 1, 2, 3
TAR_SAME_KEY = 1


def tar_scan():
    """kylix_tar_scan of the loaded library, or None (see tar_scan_why())."""
    lib()
    return _tar_scan


def tar_scan_why() -> str:
    """Where kylix_tar_scan comes from, or why it is not there."""
    lib()
    return _tar_scan_why or ("libkylix is not loaded: " + _why)


def why() -> str:
    lib()
    return _why


def strerror(err: int) -> str:
    """The thread's last libkylix message, else the code's description."""
    L = lib()
    if L is not None:
        for s in (L.kylix_last_error(), L.kylix_strerror(err)):
            if s:
                return s.decode("utf-8", "replace")
    return os.strerror(-err if err < 0 else err)


class LibFile:
    """A file opened through libkylix. pread_into is thread-safe (the library
    is), and ctypes drops the GIL around the call, so threads read in parallel."""

    def __init__(self, path: str):
        L = lib()
        if L is None:
            raise OSError("libkylix is not available: " + why())
        self._L = L
        h = ctypes.c_void_p()
        rc = L.kylix_open(os.fsencode(path), ctypes.byref(h))
        if rc < 0:
            raise OSError(-rc, f"kylix_open {path}: {strerror(rc)}")
        self._h = h

    def pread_into(self, addr: int, n: int, off: int) -> dict:
        """Reads exactly n bytes at off into addr; returns {path: bytes}
        ("pack": from the node's pack fds, "fuse": through the mount)."""
        info = ReadInfo()
        got, pack, fuse = 0, 0, 0
        while got < n:
            k = self._L.kylix_pread(self._h, ctypes.c_void_p(addr + got), n - got, off + got, ctypes.byref(info))
            if k < 0:
                raise OSError(-k, f"kylix_pread at {off + got}: {strerror(k)}")
            if k == 0:
                raise EOFError(f"file ended at {off + got}, {n - got} bytes short")
            got += k
            pack += info.bytes_pack
            fuse += info.bytes_fuse
        return {"pack": pack, "fuse": fuse}

    def close(self):
        if self._h:
            self._L.kylix_close(self._h)
            self._h = None
