"""Shared helpers: an independent writer and a numpy reader of safetensors
files, to check kylix against something that is not kylix."""

import ctypes
import json
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
KYLIX_BIN = os.path.join(REPO, "bin", "kylix")

try:
    import safetensors.torch as st_torch  # the real package (the GPU machine has it)
except ImportError:
    st_torch = None

ALLOW_SKIP = os.environ.get("KYLIX_TEST_ALLOW_SKIP") == "1"


def needs(ok, what):
    """Decorates a test or a test class that needs a real client (bin/kylix,
    libkylix, /dev/fuse): it runs when ok; otherwise it fails, naming what is
    missing, or skips where KYLIX_TEST_ALLOW_SKIP=1 (the Go tests'
    internal/testneeds does the same). `make test` as root installs the
    clients first (scripts/test-deps.sh)."""
    msg = "missing client: %s (`make test` as root installs the test clients; KYLIX_TEST_ALLOW_SKIP=1 skips instead)" % what
    if ok:
        return lambda obj: obj
    if ALLOW_SKIP:
        return unittest.skip(msg)

    def fail(obj):
        if isinstance(obj, type):
            def setUpClass(cls):
                raise AssertionError(msg)
            obj.setUpClass = classmethod(setUpClass)
            return obj

        def test(self):
            self.fail(msg)
        test.__name__ = obj.__name__
        return test
    return fail


SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def write_st(path, tensors, metadata=None, pad_to=8):
    """tensors: list of (name, dtype, shape, raw bytes), written in that order."""
    hdr, off = {}, 0
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    js = json.dumps(hdr).encode()
    js += b" " * ((-len(js)) % pad_to)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for _, _, _, raw in tensors:
            f.write(raw)


def raw_header(path, js: bytes, data: bytes = b""):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + data)


def numpy_parse(path):
    """{name: (dtype, shape, raw bytes)} read with numpy from the file: a
    deliberately naive reference (no validation)."""
    buf = np.fromfile(path, dtype=np.uint8)
    n = int(buf[:8].view("<u8")[0])
    hdr = json.loads(buf[8:8 + n].tobytes())
    hdr.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], tuple(v["shape"]), buf[base + v["data_offsets"][0]: base + v["data_offsets"][1]].tobytes())
            for k, v in hdr.items()}


def tbytes(t):
    """The raw bytes of a CPU tensor (contiguous copy if needed)."""
    t = t.detach().cpu().contiguous()
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def demo_model(size="24MiB", seed=1):
    """Writes a model with the Go writer (bin/kylix demo-model); returns its dir."""
    if not os.path.exists(KYLIX_BIN):
        raise AssertionError(f"{KYLIX_BIN} is missing: run `make build` first")
    d = tempfile.mkdtemp(prefix="kylix-py-")
    subprocess.run([KYLIX_BIN, "demo-model", "--size", size, "--seed", str(seed), d],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return d


def shards(d):
    b = os.path.join(d, "base")
    return sorted(os.path.join(b, f) for f in os.listdir(b) if f.endswith(".safetensors"))
