"""A strict, bounded parser for safetensors headers.

The rules are the safetensors crate's (safetensors/src/tensor.rs, validate):
an 8-byte little-endian header length N (1 <= N <= 100 MB, within the file),
N bytes of UTF-8 JSON starting with '{', an object whose "__metadata__" is a
string-to-string map and whose every other key names a tensor with a known
dtype, a shape of non-negative integers and data_offsets [begin, end) whose
length is exactly the tensor's byte size; sorted by offset, the tensors tile
the data section with no gap or overlap, from 0 to the end of the file.
Duplicate keys are refused (serde would keep the last; a header that says
two things is not one we want to guess about). Unknown fields inside a tensor
entry are ignored.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

MAX_HEADER_LEN = 100_000_000  # safetensors' MAX_HEADER_SIZE
MAX_TENSORS = 1 << 20  # far above any real checkpoint, bounds the work
MAX_DIMS = 64
METADATA_KEY = "__metadata__"

# dtype -> element size in bytes. The same list as chunkstore/safetensors.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "F64": 8, "I64": 8, "U64": 8,
}


class SafetensorError(ValueError):
    """The file is not a well-formed safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # relative to the data section
    end: int
    data_start: int  # absolute file offset of the data section

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def offset(self) -> int:
        """Absolute file offset of the tensor's first byte."""
        return self.data_start + self.begin

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]


@dataclass
class Header:
    header_len: int
    tensors: dict[str, TensorInfo] = field(default_factory=dict)  # in file order
    metadata: dict[str, str] | None = None

    @property
    def data_start(self) -> int:
        return 8 + self.header_len


def _err(msg: str) -> SafetensorError:
    return SafetensorError("safetensors: " + msg)


def _no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _err(f"duplicate key {k!r} in the header")
        d[k] = v
    return d


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_bytes(b: bytes, file_size: int) -> Header:
    """Parses a header held in memory: b holds the 8-byte length and at least
    the JSON after it. file_size is the size of the whole file."""
    if file_size < 8 or len(b) < 8:
        raise _err(f"file is {min(file_size, len(b))} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", b, 0)
    if n == 0:
        raise _err("header length is 0")
    if n > MAX_HEADER_LEN:
        raise _err(f"header length {n} exceeds the {MAX_HEADER_LEN}-byte limit")
    if n > file_size - 8:
        raise _err(f"header length {n} runs past the end of the {file_size}-byte file")
    if len(b) < 8 + n:
        raise _err(f"header is {n} bytes but only {len(b) - 8} were given")
    raw = bytes(b[8:8 + n])
    if raw[:1] != b"{":
        raise _err("header does not start with '{'")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _err(f"header is not valid UTF-8: {e}") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_dups)
    except SafetensorError:
        raise
    except RecursionError:
        raise _err("header JSON nests too deeply") from None
    except ValueError as e:
        raise _err(f"header is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise _err("header is not a JSON object")
    h = Header(header_len=n)
    data_len = file_size - h.data_start
    infos = []
    for key, val in obj.items():
        if key == METADATA_KEY:
            if not isinstance(val, dict) or not all(isinstance(v, str) for v in val.values()):
                raise _err(f"{METADATA_KEY} is not an object of strings")
            h.metadata = dict(val)
            continue
        if len(infos) >= MAX_TENSORS:
            raise _err(f"more than {MAX_TENSORS} tensors")
        infos.append(_parse_tensor(key, val, h.data_start))
    # safetensors sorts by offsets and then demands contiguity.
    infos.sort(key=lambda t: (t.begin, t.end, t.name))
    pos = 0
    for t in infos:
        if t.begin != pos:
            raise _err(f"tensor {t.name!r} starts at data offset {t.begin}, expected {pos} "
                       "(tensors must tile the data section with no gap or overlap)")
        pos = t.end
    if pos != data_len:
        raise _err(f"tensors cover {pos} bytes but the data section is {data_len} bytes")
    for t in infos:
        h.tensors[t.name] = t
    return h


def _parse_tensor(name: str, val, data_start: int) -> TensorInfo:
    if not isinstance(val, dict):
        raise _err(f"tensor {name!r}: entry is not an object")
    # Unknown fields are ignored, as serde's default and libkylix's parser do.
    dtype, shape, offs = val.get("dtype"), val.get("shape"), val.get("data_offsets")
    if dtype is None or shape is None or offs is None:
        raise _err(f"tensor {name!r}: missing dtype, shape or data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise _err(f"tensor {name!r}: unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_is_int(d) and d >= 0 for d in shape)):
        raise _err(f"tensor {name!r}: shape {shape!r} is not a list of at most {MAX_DIMS} non-negative integers")
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) and o >= 0 for o in offs):
        raise _err(f"tensor {name!r}: data_offsets {offs!r} is not two non-negative integers")
    begin, end = offs
    if end < begin:
        raise _err(f"tensor {name!r}: data_offsets [{begin},{end}) end before they begin")
    n = DTYPE_SIZES[dtype]
    for d in shape:
        n *= d
    if n != end - begin:
        raise _err(f"tensor {name!r}: data_offsets [{begin},{end}) hold {end - begin} bytes, "
                   f"but {dtype}{shape} needs {n}")
    return TensorInfo(name, dtype, tuple(shape), begin, end, data_start)


def parse_fd(fd: int) -> Header:
    """Reads and parses the header of an open file (two preads, never the data)."""
    size = os.fstat(fd).st_size
    prefix = os.pread(fd, 8, 0)
    if len(prefix) < 8 or size < 8:
        raise _err(f"file is {size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix)
    if n == 0 or n > MAX_HEADER_LEN or n > size - 8:
        return parse_bytes(prefix, size)  # raises with the precise reason
    buf = bytearray(8 + n)
    buf[:8] = prefix
    mv = memoryview(buf)
    got = 8
    while got < 8 + n:
        k = os.preadv(fd, [mv[got:]], got)
        if k == 0:
            raise _err(f"file ended inside the {n}-byte header")
        got += k
    return parse_bytes(buf, size)


def parse_file(path: str | os.PathLike) -> Header:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return parse_fd(fd)
    finally:
        os.close(fd)
