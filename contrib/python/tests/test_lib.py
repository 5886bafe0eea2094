"""The libkylix backend through ctypes: when a library is present (KYLIX_LIB,
or bin/libkylix.so once `make build` builds it), reads go through kylix_pread,
say so, and give the same bytes; a library that does not load or speaks
another ABI is ignored with a reason, and loads still work."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import kylix._lib as klib
import kylix.torch as kt

from helpers import REPO, needs, numpy_parse, tbytes, write_st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, **env):
    e = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout


class LibTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kylix-py-")
        self.addCleanup(shutil.rmtree, self.dir)
        self.p = os.path.join(self.dir, "m.safetensors")
        write_st(self.p, [("a", "U8", (5000, 33), os.urandom(165000)), ("b", "F32", (7,), os.urandom(28))])

    def test_broken_lib_is_ignored(self):
        bad = os.path.join(self.dir, "libkylix.so")
        with open(bad, "wb") as f:
            f.write(b"not an ELF file")
        out = run_py("import kylix._lib as l, kylix.torch as kt; d = kt.load_file(%r); "
                     "print(l.lib() is None, sorted(kt.last_load_info()['bytes']), l.why())" % self.p,
                     KYLIX_LIB=bad)
        self.assertTrue(out.startswith("True ['pread']"), out)
        self.assertIn(bad, out)

    @needs(klib.lib() is not None, "libkylix (KYLIX_LIB unset and %s/bin/libkylix.so absent: make build with a C compiler, apt-get install -y gcc libc6-dev)" % REPO)
    def test_reads_through_lib(self):
        got = kt.load_file(self.p)
        paths = set(kt.last_load_info()["bytes"])
        self.assertTrue(paths and all(p.startswith("libkylix-") for p in paths), paths)
        ref = numpy_parse(self.p)
        for k, (_dt, shape, raw) in ref.items():
            self.assertEqual(tuple(got[k].shape), shape)
            self.assertTrue(tbytes(got[k]) == raw, k)
        for rank in range(3):
            part = kt.load_file(self.p, tp_rank=rank, tp_size=3, split={"^a$": 1})
            self.assertTrue(tbytes(part["a"]) == tbytes(got["a"].chunk(3, 1)[rank]))
        with self.assertRaises(OSError):
            klib.LibFile(os.path.join(self.dir, "missing"))


if __name__ == "__main__":
    unittest.main()
