#!/usr/bin/env python3
"""Builds the kylix wheel with the standard library only (a wheel is a zip
with a .dist-info holding METADATA, WHEEL, entry_points.txt and RECORD).

    python3 build_wheel.py OUTDIR [--lib PATH/libkylix.so]

With --lib (make python passes bin/libkylix.so when it exists) the library
goes inside the package as kylix/libkylix.so, where kylix._lib looks first,
and the wheel is tagged for this platform; without it the wheel is pure
Python (py3-none-any). Timestamps are fixed, so the same tree gives the same
bytes.

It is also this package's PEP 517 build backend (pyproject.toml:
build-backend = "build_wheel", backend-path = ["."], requires = []), so
`pip install ./contrib/python` (and `pip install -e`, and `python3 -m build`)
need nothing from an index: pip sets up an empty build environment and calls
the hooks below. Through pip, bin/libkylix.so of the source tree goes inside
when it exists (config setting lib=PATH picks another, lib= none).
"""

import argparse
import base64
import hashlib
import io
import os
import platform
import re
import sys
import tarfile
import tomllib
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
EPOCH = (1980, 1, 1, 0, 0, 0)


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _project() -> dict:
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        proj = tomllib.load(f)["project"]
    with open(os.path.join(HERE, "kylix", "__init__.py")) as f:
        m = re.search(r'__version__ = "([^"]+)"', f.read())
    if not m or m.group(1) != proj["version"]:
        raise SystemExit(f"kylix/__init__.py __version__ does not match pyproject.toml {proj['version']}")
    return proj


def _dist_info(proj: dict, tag: str, purelib: bool) -> dict:
    """The .dist-info files but RECORD, by path inside the wheel."""
    name, version = proj["name"], proj["version"]
    di = f"{name}-{version}.dist-info"
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
            f"Summary: {proj.get('description', '')}", f"Requires-Python: {proj['requires-python']}"]
    meta += [f"Requires-Dist: {d}" for d in proj.get("dependencies", [])]
    ep = []
    for group, entries in proj.get("entry-points", {}).items():
        ep.append(f"[{group}]")
        ep += [f"{k} = {v}" for k, v in entries.items()]
    return {
        f"{di}/METADATA": ("\n".join(meta) + "\n").encode(),
        f"{di}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: kylix build_wheel.py\n"
                        f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n").encode(),
        f"{di}/entry_points.txt": ("\n".join(ep) + "\n").encode(),
        f"{di}/top_level.txt": b"kylix\n",
    }


def _write_wheel(outdir: str, proj: dict, tag: str, files: dict) -> str:
    di = f"{proj['name']}-{proj['version']}.dist-info"
    rec = [f"{p},{record_hash(d)},{len(d)}" for p, d in files.items()] + [f"{di}/RECORD,,"]
    files[f"{di}/RECORD"] = ("\n".join(rec) + "\n").encode()
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, f"{proj['name']}-{proj['version']}-{tag}.whl")
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            zi = zipfile.ZipInfo(p, EPOCH)
            zi.external_attr = (0o755 if p.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    os.replace(tmp, out)
    return out


def _tag(lib: str | None) -> str:
    return "py3-none-linux_" + platform.machine().replace("-", "_") if lib else "py3-none-any"


def build(outdir: str, lib: str | None) -> str:
    proj = _project()
    tag = _tag(lib)
    files = {}
    pkg = os.path.join(HERE, "kylix")
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), "rb") as f:
                files[f"kylix/{fn}"] = f.read()
    if lib:
        with open(lib, "rb") as f:
            files["kylix/libkylix.so"] = f.read()
    files.update(_dist_info(proj, tag, purelib=not lib))
    return _write_wheel(outdir, proj, tag, files)


# ---- PEP 517 and PEP 660 hooks (pip install ./contrib/python, pip install -e) ----

def _hook_lib(config_settings) -> str | None:
    """The libkylix.so a wheel built through pip carries: config setting lib
    (empty: none), else bin/libkylix.so of the source tree where it exists."""
    lib = (config_settings or {}).get("lib")
    if lib is None:
        lib = os.path.join(HERE, "..", "..", "bin", "libkylix.so")
        return lib if os.path.exists(lib) else None
    if lib and not os.path.exists(lib):
        raise SystemExit(f"config setting lib={lib}: no such file")
    return lib or None


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    proj = _project()
    tag = _tag(_hook_lib(config_settings))
    files = _dist_info(proj, tag, purelib=tag == "py3-none-any")
    for p, d in files.items():
        path = os.path.join(metadata_directory, p)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(d)
    return f"{proj['name']}-{proj['version']}.dist-info"


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return os.path.basename(build(wheel_directory, _hook_lib(config_settings)))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel holding only a .pth file that puts this directory on sys.path:
    the package is imported from the source tree, and kylix._lib finds
    bin/libkylix.so of the tree there."""
    proj = _project()
    tag = "py3-none-any"
    files = {"kylix_editable.pth": (HERE + "\n").encode()}
    files.update(_dist_info(proj, tag, purelib=True))
    return os.path.basename(_write_wheel(wheel_directory, proj, tag, files))


def build_sdist(sdist_directory, config_settings=None):
    proj = _project()
    base = f"{proj['name']}-{proj['version']}"
    out = os.path.join(sdist_directory, base + ".tar.gz")
    names = ["pyproject.toml", "build_wheel.py", "README.md"]
    names += [os.path.join("kylix", fn) for fn in sorted(os.listdir(os.path.join(HERE, "kylix"))) if fn.endswith(".py")]
    pkg_info = _dist_info(proj, "py3-none-any", True)[f"{base}.dist-info/METADATA"]
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as t:
        def add(name, data):
            ti = tarfile.TarInfo(f"{base}/{name}")
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 315532800
            t.addfile(ti, io.BytesIO(data))
        for n in names:
            with open(os.path.join(HERE, n), "rb") as f:
                add(n, f.read())
        add("PKG-INFO", pkg_info)
    return os.path.basename(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--lib", help="libkylix.so to put inside the package")
    a = ap.parse_args()
    lib = a.lib if a.lib and os.path.exists(a.lib) else None
    print(build(a.outdir, lib))


if __name__ == "__main__":
    sys.exit(main())
