#!/usr/bin/env python3
"""Builds the kylix wheel with the standard library only (a wheel is a zip
with a .dist-info holding METADATA, WHEEL, entry_points.txt and RECORD).

    python3 build_wheel.py OUTDIR [--lib PATH/libkylix.so]

With --lib (make python passes bin/libkylix.so when it exists) the library
goes inside the package as kylix/libkylix.so, where kylix._lib looks first,
and the wheel is tagged for this platform; without it the wheel is pure
Python (py3-none-any). Timestamps are fixed, so the same tree gives the same
bytes.
"""

import argparse
import base64
import hashlib
import os
import platform
import re
import sys
import tomllib
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
EPOCH = (1980, 1, 1, 0, 0, 0)


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build(outdir: str, lib: str | None) -> str:
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        proj = tomllib.load(f)["project"]
    name, version = proj["name"], proj["version"]
    with open(os.path.join(HERE, "kylix", "__init__.py")) as f:
        m = re.search(r'__version__ = "([^"]+)"', f.read())
    if not m or m.group(1) != version:
        raise SystemExit(f"kylix/__init__.py __version__ does not match pyproject.toml {version}")
    tag = "py3-none-any"
    if lib:
        tag = "py3-none-linux_" + platform.machine().replace("-", "_")
    files = {}
    pkg = os.path.join(HERE, "kylix")
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), "rb") as f:
                files[f"kylix/{fn}"] = f.read()
    if lib:
        with open(lib, "rb") as f:
            files["kylix/libkylix.so"] = f.read()
    di = f"{name}-{version}.dist-info"
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
            f"Summary: {proj.get('description', '')}", f"Requires-Python: {proj['requires-python']}"]
    meta += [f"Requires-Dist: {d}" for d in proj.get("dependencies", [])]
    files[f"{di}/METADATA"] = ("\n".join(meta) + "\n").encode()
    files[f"{di}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kylix build_wheel.py\n"
                            f"Root-Is-Purelib: {'false' if lib else 'true'}\nTag: {tag}\n").encode()
    ep = []
    for group, entries in proj.get("entry-points", {}).items():
        ep.append(f"[{group}]")
        ep += [f"{k} = {v}" for k, v in entries.items()]
    files[f"{di}/entry_points.txt"] = ("\n".join(ep) + "\n").encode()
    files[f"{di}/top_level.txt"] = b"kylix\n"
    rec = [f"{p},{record_hash(d)},{len(d)}" for p, d in files.items()] + [f"{di}/RECORD,,"]
    files[f"{di}/RECORD"] = ("\n".join(rec) + "\n").encode()
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, f"{name}-{version}-{tag}.whl")
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            zi = zipfile.ZipInfo(p, EPOCH)
            zi.external_attr = (0o755 if p.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    os.replace(tmp, out)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--lib", help="libkylix.so to put inside the package")
    a = ap.parse_args()
    lib = a.lib if a.lib and os.path.exists(a.lib) else None
    print(build(a.outdir, lib))


if __name__ == "__main__":
    sys.exit(main())
