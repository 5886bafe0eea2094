"""The one ctypes binding of libkylix, tolerant of its absence.

libkylix (contrib/libkylix, kylix.h) is found at $KYLIX_LIB, else inside this
package (the wheel carries it), else at bin/libkylix.so of the source tree
this package sits in. If none loads, or a symbol we need is missing, lib()
returns None and callers read the file with plain preads: the library is a
fast path, never a requirement.

The binding follows the API sketch of docs ONRAMP section C:
  int kylix_open(const char *path, kylix_file **out);
  void kylix_close(kylix_file *);
  ssize_t kylix_pread(kylix_file *, void *buf, size_t n, uint64_t off, kylix_read_info *info);
  const char *kylix_strerror(int err);
kylix_read_info's layout is not read here (it was being written in parallel);
we hand the library a zeroed 256-byte buffer, larger than any sane info
struct, and count the bytes as "libkylix". Reconcile with kylix.h at merge.
"""

from __future__ import annotations

import ctypes
import os
import threading

_lock = threading.Lock()
_lib = None
_tried = False
_why = ""

INFO_BUF = 256


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
                L.kylix_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
                L.kylix_open.restype = ctypes.c_int
                L.kylix_close.argtypes = [ctypes.c_void_p]
                L.kylix_close.restype = None
                L.kylix_pread.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_uint64, ctypes.c_void_p]
                L.kylix_pread.restype = ctypes.c_ssize_t
                L.kylix_strerror.argtypes = [ctypes.c_int]
                L.kylix_strerror.restype = ctypes.c_char_p
            except (OSError, AttributeError) as e:
                _why = f"{path}: {e}"
                continue
            _lib = L
            _why = f"loaded {path}"
            return _lib
        return None


def why() -> str:
    lib()
    return _why


def strerror(err: int) -> str:
    L = lib()
    if L is not None:
        s = L.kylix_strerror(err)
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

    def pread_into(self, addr: int, n: int, off: int) -> int:
        info = ctypes.create_string_buffer(INFO_BUF)
        got = 0
        while got < n:
            k = self._L.kylix_pread(self._h, ctypes.c_void_p(addr + got), n - got, off + got, info)
            if k < 0:
                raise OSError(-k, f"kylix_pread at {off + got}: {strerror(k)}")
            if k == 0:
                raise EOFError(f"file ended at {off + got}, {n - got} bytes short")
            got += k
        return got

    def close(self):
        if self._h:
            self._L.kylix_close(self._h)
            self._h = None
